-- Outcome readers: a finished job's outcome marked processed, once. The mark is
-- the finished_at it was made for, so a job run again (retried) and finished
-- anew is unprocessed again without any other statement clearing it. Added at
-- the end of the table; no existing row changes (NULL: not processed).
ALTER TABLE jobs ADD COLUMN processed_mark REAL;

-- Holding a queued job back: a held job is queued with run_at parked at the
-- hold moment (conveyor.job.HOLD_AT, later than any job may be due), so that no
-- claim, which takes due jobs only, can start it; held_run_at keeps the run_at
-- it had, given back when it is let go. Added at the end of the table; no
-- existing row changes.
ALTER TABLE jobs ADD COLUMN held_run_at REAL;

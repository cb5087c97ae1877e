-- One event per attempt instead of two: a claim writes no "claimed" event; the
-- event that ends the attempt (succeeded, failed, retried, rescued, ...) carries
-- its start here, beside the worker it already names. A job's history
-- (event_list) still shows each attempt's claim, from this column. Events
-- written before keep their claimed rows and have no start of their own.
ALTER TABLE events ADD COLUMN started_at REAL;

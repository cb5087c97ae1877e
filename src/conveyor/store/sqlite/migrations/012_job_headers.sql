-- A job's headers: metadata given at enqueue, by the caller or a middleware,
-- for the worker side (trace context, a request id), as a JSON object of
-- strings; NULL when there are none. Added at the end of the table, so that
-- ``SELECT *`` keeps every other column where it was; no existing row changes.
ALTER TABLE jobs ADD COLUMN headers TEXT;

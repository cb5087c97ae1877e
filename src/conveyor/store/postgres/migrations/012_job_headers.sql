-- A job's headers: metadata given at enqueue, by the caller or a middleware,
-- for the worker side (trace context, a request id), as a JSON object of
-- strings; NULL when there are none. json like args (given back as sent).
-- Nullable without a default: adding it rewrites no row and takes a moment.
ALTER TABLE jobs ADD COLUMN headers json;

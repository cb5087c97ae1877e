-- What an operator asked of a worker (conveyor workers quiet|stop|concurrency, the
-- dashboard's workers page): JSON of quiet, stop and concurrency, NULL for nothing.
-- The worker reads it with its check-in, which returns it.
ALTER TABLE workers ADD COLUMN control text;

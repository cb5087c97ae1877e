-- What a write's result says beyond its counts: rows enqueued without a key
-- because their key column was null (option nullKeys = keyless), and how the
-- write committed ('pieces', 'one transaction', 'per partition').
ALTER TABLE spark_write_results ADD COLUMN IF NOT EXISTS keyless bigint NOT NULL DEFAULT 0;
ALTER TABLE spark_write_results ADD COLUMN IF NOT EXISTS path text;

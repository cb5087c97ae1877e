-- What an operator asks of a worker (conveyor.store.worker_control).

-- name: worker_control
-- The changes merge into what was asked before (a key with null drops it); a
-- worker that is not registered is not written (no row, nothing returned).
UPDATE workers
SET control = jsonb_strip_nulls(coalesce(control::jsonb, '{}'::jsonb) || %(changes)s::jsonb)::text
WHERE id = %(id)s
RETURNING control

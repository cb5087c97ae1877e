-- What an operator asks of a worker (conveyor.store.worker_control).

-- name: worker_control
-- The changes merge into what was asked before (json_patch: a key with null
-- drops it); a worker that is not registered is not written.
UPDATE workers
SET control = json_patch(coalesce(control, '{}'), :changes)
WHERE id = :id
RETURNING control

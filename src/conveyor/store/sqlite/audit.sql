-- The audit's statements (conveyor.store.audit): one row per operator's action.

-- name: audit_insert
INSERT INTO audit_log (at, actor, source, action, target, jobs)
VALUES (:at, :actor, :source, :action, :target, :jobs)

-- name: audit_list
-- Newest first, below an id when paging (the primary key, read backwards).
SELECT id, at, actor, source, action, target, jobs
FROM audit_log
WHERE :before IS NULL OR id < :before
ORDER BY id DESC
LIMIT :limit

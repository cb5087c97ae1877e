-- The audit's statements (conveyor.store.audit): one row per operator's action.

-- name: audit_insert
INSERT INTO audit_log (at, actor, source, action, target, jobs)
VALUES (%(at)s, %(actor)s, %(source)s, %(action)s, %(target)s, %(jobs)s)

-- name: audit_list
-- Newest first, below an id when paging (the primary key's index, read backwards).
SELECT id, at, actor, source, action, target, jobs
FROM audit_log
WHERE %(before)s::bigint IS NULL OR id < %(before)s::bigint
ORDER BY id DESC
LIMIT %(limit)s

-- Reading and rewriting jobs' stored values in place (see store/payloads.py):
-- what `conveyor encryption rotate` runs.

-- name: payload_page
-- A page of jobs' values, in id order.
SELECT id, args, kwargs, result FROM jobs
WHERE id > :after_id
ORDER BY id
LIMIT :limit

-- name: payload_page_steps
-- The steps' results of the jobs of one page (ids in (after_id, last_id]).
SELECT job_id, name, result FROM job_steps
WHERE job_id > :after_id AND job_id <= :last_id
ORDER BY job_id, name

-- name: payload_rewrite_job
-- Replace a job's value only while it holds the text read: a result recorded,
-- or arguments replaced, since the page was read are kept.
UPDATE jobs SET
    args = CASE WHEN :field = 'args' AND args = :old THEN :new ELSE args END,
    kwargs = CASE WHEN :field = 'kwargs' AND kwargs = :old THEN :new ELSE kwargs END,
    result = CASE WHEN :field = 'result' AND result = :old THEN :new ELSE result END
WHERE id = :id
  AND CASE :field WHEN 'args' THEN args WHEN 'kwargs' THEN kwargs ELSE result END = :old

-- name: payload_rewrite_step
UPDATE job_steps SET result = :new
WHERE job_id = :id AND name = :step AND result = :old

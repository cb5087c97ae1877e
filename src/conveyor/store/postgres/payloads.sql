-- Reading and rewriting jobs' stored values in place (see store/payloads.py):
-- what `conveyor encryption rotate` runs. json has no equality: values are
-- compared as the text stored (json keeps it as sent).

-- name: payload_page
-- A page of jobs' values, in id order, with their steps' results.
SELECT j.id, j.args::text, j.kwargs::text, j.result::text,
       coalesce((SELECT json_agg(json_build_array(s.name, s.result::text) ORDER BY s.name)
                 FROM job_steps s WHERE s.job_id = j.id), '[]')::text
FROM jobs j
WHERE j.id > %(after_id)s
ORDER BY j.id
LIMIT %(limit)s

-- name: payload_rewrite_job
-- Replace a job's value only while it holds the text read: a result recorded,
-- or arguments replaced, since the page was read are kept.
UPDATE jobs SET
    args = CASE WHEN %(field)s::text = 'args' THEN %(new)s::json ELSE args END,
    kwargs = CASE WHEN %(field)s::text = 'kwargs' THEN %(new)s::json ELSE kwargs END,
    result = CASE WHEN %(field)s::text = 'result' THEN %(new)s::json ELSE result END
WHERE id = %(id)s
  AND CASE %(field)s::text WHEN 'args' THEN args::text WHEN 'kwargs' THEN kwargs::text
                     ELSE result::text END = %(old)s::text

-- name: payload_rewrite_step
UPDATE job_steps SET result = %(new)s::json
WHERE job_id = %(id)s AND name = %(step)s AND result::text = %(old)s::text

-- A deleted job's edges onto its parents go with it, as before; the edges onto
-- it from children that stay are kept, resolved as 'deleted', so that a child
-- still to run names the parent that is gone (ctx.upstream_errors) instead of
-- leaving it out. They go when the child is deleted. No existing row changes.
CREATE OR REPLACE FUNCTION conveyor_forget_flows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_edges WHERE child IN (SELECT id FROM gone);
    UPDATE job_edges SET resolved = 'deleted'
    WHERE parent IN (SELECT id FROM gone) AND resolved IS DISTINCT FROM 'deleted';
    DELETE FROM job_flows WHERE job_id IN (SELECT id FROM gone);
    RETURN NULL;
END
$$;

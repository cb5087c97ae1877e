-- name: job_insert_many
-- uses flows.lua
-- ARGV: now, jobs (JSON [[queue, task, args, kwargs, priority, run_at,
-- max_attempts, key, unique, group, batch, limit_key, headers], ...]).
-- A job with a key that a live job of its queue holds (or, unique "forever",
-- any job not yet purged) is not inserted: that job answers in its place, and
-- so does the first job of the batch with the same key. Returns, per job in
-- order: {0, id} inserted now, or {1, id, fields...} an existing job; and the
-- jobs it could not read (unreadable).
local now_n, now_s = clock(ARGV[1])
local jobs = cjson.decode(ARGV[2])
-- Workflows (flows.lua): ARGV[3], per job, null or {after ids, after positions
-- (0-based, of earlier jobs of this insert), on_failure}; ARGV[4] a workflow id.
-- ARGV[5] the workflow's name: a workflow whose id is taken returns its jobs.
local links = ARGV[3] and cjson.decode(ARGV[3]) or {}
local workflow = ARGV[4] and ARGV[4] ~= '' and ARGV[4] or nil
if workflow then
    local stored = flow_workflow_ids(workflow)
    if stored then return {'workflow', stored} end
end
local missing = flow_missing_parent(links)
if missing then return {'missing', missing} end
-- First what becomes of each job, then one range of ids for those inserted.
local plan, first_of_key, count = {}, {}, 0
for position, n in ipairs(jobs) do
    local key = v(n[8])
    local pair = key and (nm(n[1]) .. ':' .. key)
    if pair and first_of_key[pair] then
        plan[position] = {'same', first_of_key[pair]}
    else
        local found = key and find_key(n[1], key, n[9])
        if found then
            plan[position] = {'old', found}
            if pair then first_of_key[pair] = position end
        else
            count = count + 1
            plan[position] = {'new'}
            if pair then first_of_key[pair] = position end
        end
    end
end
local next_id = redis.call('INCRBY', P .. 'ids', count) - count
local out = {}
for position, n in ipairs(jobs) do
    local what = plan[position]
    if what[1] == 'new' then
        next_id = next_id + 1
        local j = insert(n, now_s, tostring(next_id))
        out[position] = {0, next_id}
        local l = v(links[position])
        if l then
            local parents = {}
            for _, p in ipairs(l[1]) do parents[#parents + 1] = tostring(p) end
            for _, at in ipairs(l[2]) do parents[#parents + 1] = tostring(out[at + 1][2]) end
            flow_link(j, parents, l[3], workflow, now_s)
            out[position] = {0, next_id, j.state, j.error}
        end
    elseif what[1] == 'same' then
        out[position] = out[what[2]]
    else
        local answer = {1, tonumber(what[2])}
        for _, x in ipairs(flat(load(what[2]))) do answer[#answer + 1] = x end
        out[position] = answer
    end
end
if workflow then flow_workflow_record(workflow, ARGV[5], #jobs, now_s) end
return done({out, unreadable})

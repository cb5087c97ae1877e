-- name: job_insert_many
-- uses flows.lua
-- ARGV: now, jobs (JSON [[queue, task, args, kwargs, priority, run_at,
-- max_attempts, key, unique, group, batch, limit_key, headers], ...]).
-- A job with a key that a live job of its queue holds (or, unique "forever",
-- any job not yet purged) is not inserted: that job answers in its place, and
-- so does the first job of the batch with the same key. Returns, per job in
-- order: {0, id} inserted now, or {1, id, fields...} an existing job; and the
-- jobs it could not read (unreadable).
gather = true -- the sorted-set writes sent at done() (see zwrite)
local now_n, now_s = clock(ARGV[1])
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
local jobs, plan, first, count = cjson.decode(ARGV[2]), {}, {}, 0
-- on_conflict="replace" (n[15]; conveyor/replace.py): the queued job holding the
-- key takes the new arguments, run_at and priority (the plan then answers with
-- it); a running one gives its key up, so that the plan inserts a new job.
local function replace_or_release(n, now_s)
    local holder = find_key(n[1], n[8], 'live')
    local j = holder and load(holder)
    if not j then return end
    if j.state == 'queued' then
        leave(j)
        -- Its ready member (common.lua's ready_member) spells the old priority: made anew.
        j.args, j.kwargs, j.priority, j.member = n[3], n[4], n[5], nil
        if j.held_run_at then -- held: stays held, due at the new run_at once let go
            j.held_run_at = n[6]
            save(j, {'args', 'kwargs', 'priority', 'held_run_at'})
        else
            j.run_at = n[6]
            save(j, {'args', 'kwargs', 'priority', 'run_at'})
        end
        enter(j)
        event(j, 'replaced', tonumber(j.attempts), now_s, nil)
        publish('jobs', j.queue)
    elseif j.state == 'running' then
        redis.call('ZREM', kk('key', j.queue, j.key), j.id)
        j.key = nil
        save(j, {'key'})
    end
end
-- First what becomes of each job ('new', the id of a job holding its key, or
-- minus the position of the first job of the batch with its key), then one
-- range of ids for those inserted.
for i, n in ipairs(jobs) do
    local pair = v(n[8]) and nm(n[1]) .. ':' .. n[8]
    local same = pair and first[pair]
    if pair and not same and n[15] == 'replace' then replace_or_release(n, now_s) end
    plan[i] = same and -same or (pair and find_key(n[1], n[8], n[9])) or 'new'
    if pair and not same then first[pair] = i end
    if plan[i] == 'new' then count = count + 1 end
end
local id, out = redis.call('INCRBY', P .. 'ids', count) - count, {}
for i, n in ipairs(jobs) do
    if plan[i] == 'new' then
        id = id + 1
        local j = insert(n, now_s, tostring(id))
        out[i] = {0, id}
        local l = v(links[i])
        if l then
            local parents = {}
            for _, p in ipairs(l[1]) do parents[#parents + 1] = tostring(p) end
            for _, at in ipairs(l[2]) do parents[#parents + 1] = tostring(out[at + 1][2]) end
            flow_link(j, parents, l[3], workflow, now_s)
            out[i] = {0, id, j.state, j.error}
        end
    elseif type(plan[i]) == 'number' then
        out[i] = out[-plan[i]]
    else
        out[i] = {1, tonumber(plan[i]), unpack(flat(load(plan[i])))}
    end
end
if workflow then flow_workflow_record(workflow, ARGV[5], #jobs, now_s) end
return done({out, unreadable})

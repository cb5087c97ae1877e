-- Workflows: jobs that wait for other jobs (the rules are conveyor/store/flows.py's;
-- see docs/workflows.md). Prepended after common.lua to the scripts that say
-- "-- uses flows.lua" and to those that use upkeep.lua (its delete forgets a
-- job's edges).
--
-- Layout:
--   wp:<child>    hash parent id -> '' while the parent has not ended, then the
--                 state it ended in (each edge is resolved once)
--   wc:<parent>   zset of the ids of its children (score: id)
--   a job's hash  pending (parents not yet ended), on_failure ('cancel' or
--                 'run'), workflow: for the jobs that wait or belong to one;
--                 children '1' on a job with a wc: set, so that the end of a
--                 job that none waits for reads nothing more
--   wf:<id>       hash of a declared workflow: name, jobs, created_at
--   wfj:<id>      zset of the ids of its jobs; workflows: zset of ids by created_at
-- A waiting job is in qs:<q>:waiting and in none of the claim's indexes (common.lua's
-- leave and enter know the state: every change of state is a move).

local function wkey(what, id) return P .. what .. ':' .. id end
local CHILDREN = {'children'}

local LOST_HOW = {failed = 'failed', cancelled = 'was cancelled', deleted = 'was deleted',
                  dropped = 'was dropped (its data was deleted or evicted)'}
local function flow_lost_error(parent, state)
    return 'job ' .. parent .. ', which this job waits for, ' .. LOST_HOW[state]
end

-- A job that will not run: cancelled, with the error that says why (or the one
-- it had).
local function flow_cancel(j, err, now_s)
    move(j, 'cancelled', 'finished_at', now_s, 'error', err or j.error or false)
    event(j, 'cancelled', tonumber(j.attempts), now_s, err)
    ended[#ended + 1] = j.id
end

-- The first job named by the links of an insert ({after ids, after positions,
-- on_failure} or null, per job) that does not exist, or nil.
local function flow_missing_parent(links)
    for _, l in ipairs(links) do
        if l ~= NULL then
            for _, p in ipairs(l[1]) do
                if not load(p) then return p end
            end
        end
    end
    return nil
end

-- A new job j waits for the jobs of ``parents`` (ids that exist): its edges,
-- its pending count and its first state (waiting; cancelled when a parent was
-- lost already and it does not run anyway; else queued, as inserted).
local function flow_link(j, parents, on_failure, workflow, now_s)
    local pending, lost = 0, nil
    for _, p in ipairs(parents) do
        local state = job_fields(p, 'state')[1]
        local ended = terminal(state)
        redis.call('HSET', wkey('wp', j.id), p, ended and state or '')
        redis.call('ZADD', wkey('wc', p), j.id, j.id)
        local parent = load(p) -- read already (flow_missing_parent, or inserted here)
        if parent and parent.children ~= '1' then
            parent.children = '1'
            save(parent, CHILDREN)
        end
        if not ended then
            pending = pending + 1
        elseif state ~= 'succeeded' and not lost then
            lost = flow_lost_error(p, state)
        end
    end
    j.pending, j.on_failure, j.workflow = tostring(pending), on_failure, workflow
    save(j, {'pending', 'on_failure', 'workflow'})
    if workflow then redis.call('ZADD', wkey('wfj', workflow), j.id, j.id) end
    if lost and on_failure ~= 'run' then
        flow_cancel(j, lost, now_s)
    elseif pending > 0 then
        move(j, 'waiting')
    end
end

-- The edges onto parent ``pid`` (which ended in ``state``) resolve: each child
-- counts down, and is noted in ``touched`` (once, in ``seen``) with, for a lost
-- parent, the error that would cancel it (``lost_of``).
local function flow_count_down(pid, state, touched, lost_of, seen)
    for _, cid in ipairs(redis.call('ZRANGE', wkey('wc', pid), 0, -1)) do
        local key = wkey('wp', cid)
        if redis.call('HGET', key, pid) == '' then
            redis.call('HSET', key, pid, state)
            local c = load(cid)
            if not c then
                -- A child whose hash is gone: dropped (handed back, in the scripts
                -- without upkeep.lua), which resolves its own children in turn.
                drop(cid, {})
            else
                c.pending = tostring((tonumber(c.pending) or 1) - 1)
                save(c, {'pending'})
                if state ~= 'succeeded' and not lost_of[cid] then
                    lost_of[cid] = flow_lost_error(pid, state)
                end
                if not seen[cid] then
                    seen[cid] = true
                    touched[#touched + 1] = c
                end
            end
        end
    end
end

-- The touched children that still wait: the last parent queues one, a lost one
-- cancels it (unless it runs anyway). Returns the ids cancelled.
local function flow_settle(touched, lost_of, now_s)
    table.sort(touched, function(a, b) return tonumber(a.id) < tonumber(b.id) end)
    local cancelled = {}
    for _, c in ipairs(touched) do
        if c.state == 'waiting' then
            if lost_of[c.id] and c.on_failure ~= 'run' then
                flow_cancel(c, lost_of[c.id], now_s)
                cancelled[#cancelled + 1] = c.id
            elseif tonumber(c.pending) <= 0 then
                move(c, 'queued')
                event(c, 'ready', tonumber(c.attempts), now_s, nil)
                publish('jobs', c.queue)
            end
        end
    end
    return cancelled
end

-- The jobs of ``ids`` that ended resolve their edges: each child counts down;
-- the last parent queues it, a lost one cancels it (unless it runs anyway),
-- and a cancelled child's own children are resolved in turn.
local function flow_release(ids, now_s)
    local frontier = ids
    while #frontier > 0 do
        local touched, lost_of, seen = {}, {}, {}
        for _, pid in ipairs(frontier) do
            pid = tostring(pid)
            local f = job_fields(pid, 'state', 'children')
            if f[2] and terminal(f[1]) then flow_count_down(pid, f[1], touched, lost_of, seen) end
        end
        frontier = flow_settle(touched, lost_of, now_s)
    end
end

-- A job an operator deletes before it ended (``how``: 'deleted'), or one dropped
-- because its hash could not be read ('dropped'): the jobs waiting for it
-- resolve it so (cancelled, unless they run anyway), so that none waits forever.
local function flow_orphan(j, now_s, how)
    local touched, lost_of, seen = {}, {}, {}
    flow_count_down(j.id, how or 'deleted', touched, lost_of, seen)
    flow_release(flow_settle(touched, lost_of, now_s), now_s)
end

-- An operator's cancel of a waiting job.
local function flow_cancel_waiting(j, now_s)
    flow_cancel(j, nil, now_s)
end

-- Whether a job has children not yet ended: retention keeps it (a child still
-- to run reads its parents' results).
local function flow_needed(j)
    for _, c in ipairs(redis.call('ZRANGE', wkey('wc', j.id), 0, -1)) do
        local s = job_fields(c, 'state')[1]
        if s == 'waiting' or s == 'queued' or s == 'running' then return true end
    end
    return false
end

-- A deleted job's edges onto its parents go with it; the edges onto it from
-- children that stay are kept, resolved as ``how`` ('deleted', or 'dropped'),
-- so that a child still to run names the parent that is gone
-- (ctx.upstream_errors) rather than leave it out. They go with the child.
local function flow_forget(j, how)
    for _, p in ipairs(redis.call('HKEYS', wkey('wp', j.id))) do
        redis.call('ZREM', wkey('wc', p), j.id)
    end
    for _, c in ipairs(redis.call('ZRANGE', wkey('wc', j.id), 0, -1)) do
        if redis.call('HEXISTS', wkey('wp', c), j.id) == 1 then
            redis.call('HSET', wkey('wp', c), j.id, how or 'deleted')
        end
    end
    redis.call('DEL', wkey('wp', j.id), wkey('wc', j.id))
    if j.workflow then redis.call('ZREM', wkey('wfj', j.workflow), j.id) end
end

-- A job dropped because its hash could not be read (upkeep.lua's drop), whatever
-- state it was in: the jobs still waiting for it resolve it as dropped, and its
-- edges go as a deleted job's do.
local function flow_dropped(id, workflow, now_s)
    local j = {id = id, workflow = workflow}
    flow_orphan(j, now_s, 'dropped')
    flow_forget(j, 'dropped')
end

-- The ids of the jobs of a stored workflow, or nil when no workflow has this id.
local function flow_workflow_ids(workflow)
    if redis.call('EXISTS', wkey('wf', workflow)) == 0 then return nil end
    return redis.call('ZRANGE', wkey('wfj', workflow), 0, -1)
end

local function flow_workflow_record(workflow, name, jobs, now_s)
    redis.call('HSET', wkey('wf', workflow), 'name', name, 'jobs', jobs, 'created_at', now_s)
    redis.call('ZADD', P .. 'workflows', now_s, workflow)
end

-- What only the scripts off the hot path need (rescue, purge, the operators'
-- actions, periodic_enqueue, job_drop and the sweep): deleting jobs, queueing
-- them again by hand, dropping the jobs that cannot be read. The store puts it
-- after common.lua in the scripts whose header says "uses upkeep.lua"; the
-- claim, finish and enqueue go without, since every function a script defines
-- is made anew on each of its runs.

-- Delete a job's events from the stream: ``seqs`` as its "events" field holds them.
local function delete_events(seqs)
    if not seqs then return end
    local entries = {}
    for seq in string.gmatch(seqs, '%d+') do entries[#entries + 1] = seq .. '-0' end
    for i = 1, #entries, 1000 do
        redis.call('XDEL', P .. 'events', unpack(entries, i, math.min(i + 999, #entries)))
    end
end

-- Delete a job with its events and every index entry.
local function delete(j)
    leave(j)
    local id = j.id
    count_queue(j.queue, -1)
    if j.key then zrem(kk('key', j.queue, j.key), id) end
    if j.group_key then zrem(P .. 'group:' .. j.group_key, id) end
    if j.batch then zrem(P .. 'batch:' .. j.batch, id) end
    delete_events(j.events)
    flow_forget(j) -- its edges (flows.lua)
    redis.call('DEL', jkey(id), P .. 'steps:' .. id, P .. 'signals:' .. id, P .. 'wait:' .. id)
    redis.call('SREM', P .. 'parked', id)
    gone[j], cache[id] = true, nil
    if j.state == 'queued' then wake_group(j) end
end

-- Manual retry: queued again, attempts reset.
local function requeue_manually(j, now_s)
    move(j, 'queued', 'attempts', '0', 'run_at', now_s, 'cancel_requested', false, 'worker', false,
         'result', false, 'error', false, 'progress', false, 'progress_message', false,
         'started_at', false, 'finished_at', false, 'expires_at', false)
    publish('jobs', j.queue)
end

-- ---------------------------------------------------------------------------
-- Jobs that cannot be read. A job's hash can vanish from under its index
-- entries: deleted by hand, or evicted by a Redis whose maxmemory-policy evicts
-- (health() warns of that). Or it can lack a field every job has. Left there,
-- such an id would hold what it held forever: its group (a running job, or a
-- head nobody can claim), its limit key's room, its queue's counts. So whoever
-- meets one in an index drops it: the claim (ready:, wait:), a finish (the job
-- it ends), rescue (the running sets), a group's next head, an enqueue's key holders,
-- purge (finished), and the Python reads that walk indexes. In the scripts
-- without this file common.lua's drop hands the job back, and the store drops
-- it by job_drop.

local DATA_MISSING = 'job data missing (deleted or evicted)'
local STATES = {'queued', 'running', 'succeeded', 'failed', 'cancelled', 'waiting'}
local FINISHED = {'succeeded', 'failed', 'cancelled'}

-- Take an id out of the index of its state, qs:<q>:<state>: of the queue given,
-- else of any queue; of the state given ('finished': any terminal one), else of
-- any. Returns the queue and state it was in.
local function leave_state_index(id, q, state)
    local queues = q and {q} or redis.call('HKEYS', P .. 'queues')
    local states = STATES
    if state == 'finished' then
        states = FINISHED
    elseif state then
        states = {state}
    end
    for _, queue in ipairs(queues) do
        for _, s in ipairs(states) do
            if redis.call('ZREM', state_key(queue, s), id) == 1 then return queue, s end
        end
    end
    return nil, nil
end

-- The group of a running job that cannot be read: one of the groups running a job.
local function group_running(id)
    for _, g in ipairs(redis.call('HKEYS', P .. 'grun')) do
        if redis.call('ZSCORE', P .. 'group:' .. g, id) then return g end
    end
    return nil
end

-- krun:<q> counted again from the queue's running jobs that can be read (when
-- a dropped job's limit key is unknown).
local function recount_key_running(q)
    zflush()
    local counts = {}
    for _, id in ipairs(redis.call('ZRANGE', state_key(q, 'running'), 0, -1)) do
        local key = job_fields(id, 'limit_key')[1]
        if key then counts[key] = (counts[key] or 0) + 1 end
    end
    redis.call('DEL', qk('krun', q))
    for key, n in pairs(counts) do redis.call('HSET', qk('krun', q), key, n) end
end

-- Drop a job that cannot be read, met in an index. ``seen`` says where: its
-- queue, state ('finished': a terminal one), ready: member, group (met as the
-- head of gq:<group>), idempotency key. What is left of its hash (nothing when
-- deleted or evicted) names more. At once it leaves the index of its state and
-- those that decide what runs next: ready:/wait:/due:/retrying:, its limit
-- key's line (kq:, found among kqkeys:), its group's running count
-- (its group found among grun's) and line (gq:, when its group is known; the
-- next head goes up), its key's running count (krun: counted again), finished,
-- and its queue's count. The indexes only listings and batch counts read
-- (group:, batch: with bcount:, key:, and gq: for a group not known) keep it
-- until the sweep (job_sweep_lost) has walked every key: the id waits in
-- lost. One "dropped" event, with what is known (queue and task may be ''),
-- and its history kept in dropped until retention.
-- Returns whether the job was dropped now (false: readable, or dropped before).
-- (It replaces common.lua's drop, which only hands the job back.)
drop = function(id, seen)
    id = tostring(id)
    if load(id) then return false end
    zflush()
    local rest, missing = {}, {}
    local flat = redis.call('HGETALL', jkey(id))
    for i = 1, #flat, 2 do rest[flat[i]] = flat[i + 1] end
    for _, name in ipairs(REQUIRED) do
        if not rest[name] then missing[#missing + 1] = name end
    end
    local q = seen.queue or rest.queue
    local group, key = seen.group or rest.group_key, seen.key or rest.key
    -- The entry it was met in goes in any case: nobody meets it there again.
    if seen.member then redis.call('ZREM', qk('ready', q), seen.member) end
    if seen.key then redis.call('ZREM', kk('key', q, seen.key), id) end
    local found, state = leave_state_index(id, q, seen.state)
    q = found or q
    local was_head = false
    if group and (state == 'queued' or seen.state == 'queued') then
        was_head = redis.call('ZRANGE', P .. 'gq:' .. group, 0, 0)[1] == id
        redis.call('ZREM', P .. 'gq:' .. group, id)
    end
    if state == 'queued' then
        redis.call('ZREM', qk('wait', q), id)
        redis.call('ZREM', qk('due', q), id)
        redis.call('ZREM', qk('retrying', q), id)
        if rest.priority then
            redis.call('ZREM', qk('ready', q), ready_member({priority = rest.priority, id = id}))
        end
        -- Its fair key's line (fq:), when its hash still names it.
        if rest.fair_key then leave_fair_line(q, {id = id, fair_key = rest.fair_key,
                                                  limit_key = rest.limit_key}) end
        if rest.limit_key then
            leave_key_line(q, rest.limit_key, id)
        else
            for _, k in ipairs(redis.call('SMEMBERS', qk('kqkeys', q))) do
                if leave_key_line(q, k, id) then break end
            end
        end
    elseif state == 'running' then
        group = group or group_running(id)
        if group then decr(P .. 'grun', group) end
        if rest.limit_key then
            decr(qk('krun', q), rest.limit_key)
        elseif redis.call('EXISTS', qk('krun', q)) == 1 then
            recount_key_running(q)
        end
    elseif state then
        redis.call('ZREM', P .. 'finished', id)
    end
    if state then
        count_queue(q, -1)
        if group then redis.call('ZREM', P .. 'group:' .. group, id) end
        if rest.batch and redis.call('ZREM', P .. 'batch:' .. rest.batch, id) == 1 then
            decr(P .. 'bcount:' .. rest.batch, state)
        end
        if key then redis.call('ZREM', kk('key', q, key), id) end
        redis.call('HSET', P .. 'lost', id, state)
    end
    local dropped = state ~= nil or #flat > 0
    if dropped then
        if #flat > 0 then redis.call('DEL', jkey(id)) end
        redis.call('DEL', P .. 'steps:' .. id, P .. 'signals:' .. id, P .. 'wait:' .. id)
        redis.call('SREM', P .. 'parked', id)
        if not NOW then clock('') end
        local reason = DATA_MISSING
        if #flat > 0 then
            reason = 'job data incomplete (no ' .. table.concat(missing, ', ') .. ')'
        end
        -- Its history (what is left of it, and this event) stays under dropped:
        -- app.get and app.events tell what became of it until retention purges it.
        local j = {id = id, queue = q or '', task = rest.task or '', worker = rest.worker,
                   events = rest.events, dropped = true}
        gone[j] = true -- nothing of it is written back to its hash
        event(j, 'dropped', tonumber(rest.attempts) or 0, fmt(NOW), reason)
        redis.call('ZADD', P .. 'dropped:at', fmt(NOW), id)
        -- Jobs that wait for it would wait forever: they resolve it (flows.lua).
        flow_dropped(id, rest.workflow, fmt(NOW))
        if q then publish('jobs', q) end
    end
    if was_head then promote_head(group) end
    if group and (dropped or was_head) then wake_group({group_key = group}) end
    return dropped
end

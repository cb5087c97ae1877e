-- Shared by every script of the Redis store, which prepends this file to each
-- operation's script (one EVALSHA per call). What only maintenance and the
-- operators' actions need is in upkeep.lua: every function defined here is
-- made anew on each run of each script, the hot ones included.
--
-- KEYS[1] is the key prefix, e.g. "{conveyor}:" (its hash tag keeps every key
-- in one cluster slot). Values cross as strings: times are epoch seconds with
-- six decimals (never Lua's number formatting, which keeps 14 digits); JSON
-- arrays carry strings or null. The keys are described in docs/architecture.md
-- ("The Redis store"). Each write is an entry in the append-only file: the
-- layout keeps them few, and a script's counters, events and job changes are
-- written once, at its end, by done().

local P = KEYS[1]
local NULL = cjson.null

local function v(x)
    if x == NULL or x == false then return nil end
    return x
end

local function nm(s) return #s .. '.' .. s end
local function fmt(x) return string.format('%.6f', x) end

-- The moment of this call: the caller's (tests fix the clock), else Redis's own.
local NOW = nil
local function clock(arg)
    if arg == nil or arg == '' then
        local t = redis.call('TIME')
        arg = string.format('%d.%06d', tonumber(t[1]), tonumber(t[2]))
    end
    NOW = tonumber(arg)
    return NOW, arg
end

local function jkey(id) return P .. 'job:' .. id end
-- A queue's keys, each made once per script (a job moved needs several, and
-- each concatenation makes and interns a new string): <what>:<q>, or with a
-- state qs:<q>:<state> (no state is named like an index).
local keys_of = {}
local function queue_key(q, what, state)
    local of_queue = keys_of[q]
    if not of_queue then
        of_queue = {}
        keys_of[q] = of_queue
    end
    local key = of_queue[state or what]
    if not key then
        key = P .. what .. ':' .. nm(q) .. (state and ':' .. state or '')
        of_queue[state or what] = key
    end
    return key
end
local function qk(what, q) return queue_key(q, what, nil) end
local function kk(what, q, key) return qk(what, q) .. ':' .. key end
-- a queue's jobs in one state (scored by id; running ones by lease expiry)
local function state_key(q, state) return queue_key(q, 'qs', state) end

-- Writes to the sorted sets a job moves through (qs:, ready:, wait:, due:,
-- retrying:, finished, key:, group:, batch:) go through zadd and zrem. In the
-- scripts that set ``gather`` (the claim, finish and enqueue) they are gathered
-- per key and sent as one variadic ZADD or ZREM: one call and one append-only
-- entry for a batch of jobs. Writes to other members commute with them; what
-- reads those sets (or needs a ZREM's answer) in such a script calls zflush()
-- first, and done() sends the rest. Other scripts write at once.
local gather = false
local zbuf, zkeys = {}, {}
local function zsend(key, buf)
    for i = 1, #buf.args, 4000 do
        redis.call(buf.op, key, unpack(buf.args, i, math.min(i + 3999, #buf.args)))
    end
end
-- Additions first: over its maxmemory Redis refuses a script's write that may
-- grow memory (ZADD, HSET...) only while the script has written nothing, and a
-- write that cannot grow it (ZREM) goes through, after which every write does. Sent first, a growing write makes a
-- full server refuse the script before it changed anything (a finish that then
-- claims flushes before its claim, ahead of its counters and events).
local function zflush()
    for _, key in ipairs(zkeys) do
        if zbuf[key].op == 'ZADD' then zsend(key, zbuf[key]) end
    end
    for _, key in ipairs(zkeys) do
        if zbuf[key].op ~= 'ZADD' then zsend(key, zbuf[key]) end
    end
    zbuf, zkeys = {}, {}
end
local function zwrite(op, key, a, b)
    if not gather then
        if b then return redis.call(op, key, a, b) end
        return redis.call(op, key, a)
    end
    local buf = zbuf[key]
    if buf and buf.op ~= op then -- a ZREM after a ZADD (or back) of the key: in order
        zsend(key, buf)
        buf.op, buf.args = op, {}
    elseif not buf then
        buf = {op = op, args = {}}
        zbuf[key], zkeys[#zkeys + 1] = buf, key
    end
    buf.args[#buf.args + 1] = a
    if b then buf.args[#buf.args + 1] = b end
end
local function zadd(key, score, member) zwrite('ZADD', key, score, member) end
local function zrem(key, member) zwrite('ZREM', key, member) end

-- Jobs per queue, changed by this script: written once, by done().
local queue_delta = {}
local function count_queue(q, delta) queue_delta[q] = (queue_delta[q] or 0) + delta end

local JOB_FIELDS = {
    'id', 'queue', 'task', 'state', 'args', 'kwargs', 'priority', 'run_at', 'attempts',
    'max_attempts', 'key', 'group_key', 'batch', 'worker', 'lease_token', 'lease_expires_at',
    'cancel_requested', 'result', 'error', 'progress', 'progress_message', 'created_at',
    'started_at', 'finished_at', 'limit_key', 'headers',
    -- a job that waits for others or belongs to a declared workflow, and ('1') one
    -- that others wait for (flows.lua)
    'pending', 'on_failure', 'workflow', 'children',
    -- a job enqueued with a deadline to start by (expires=; see job_expire.lua)
    'expires_at',
    -- a job with its own retention (retain=; see job_purge_retained.lua)
    'retain',
    -- a job with a fair key of its own (fair_key=; see fair_claim.lua)
    'fair_key',
}
-- Besides these a job's hash holds "events", the seqs of its events joined by commas.
-- A hash without one of these cannot be read (store.py's _REQUIRED says the same):
local REQUIRED = {
    'id', 'queue', 'task', 'state', 'args', 'kwargs', 'priority', 'run_at', 'attempts',
    'max_attempts', 'created_at',
}

-- A job's changes reach Redis once, by done(): one HSET of the fields the script
-- saved (an HDEL for those it cleared that Redis holds). Until then every read
-- of a job goes through load() or job_fields(), which see the script's changes.
local cache = {}    -- id -> job, read or made by this script
local held = {}     -- job -> its fields as Redis holds them: HGETALL's flat reply
local changed = {}  -- job -> names saved since (a list, and a set)
local to_write = {} -- jobs with changes, in the order they were first saved
local gone = {}     -- jobs deleted by this script
local FRESH = {}    -- held by the jobs this script made: written whole

-- A job as this script sees it; nil when its hash is gone (deleted by hand,
-- evicted) or lacks a field every job has: the callers that meet such a job in
-- an index drop it (see drop).
local function load(id)
    id = tostring(id)
    local j = cache[id]
    if j then return j end
    local flat = redis.call('HGETALL', jkey(id))
    j = {}
    for i = 1, #flat, 2 do j[flat[i]] = flat[i + 1] end
    for _, name in ipairs(REQUIRED) do
        if not j[name] then return nil end
    end
    cache[id], held[j] = j, flat
    return j
end

-- Some fields of a job, as this script left them.
local function job_fields(id, ...)
    local j = cache[tostring(id)]
    if not j then return redis.call('HMGET', jkey(id), ...) end
    local out = {}
    for i, name in ipairs({...}) do out[i] = j[name] or false end
    return out
end

-- A job's fields as a flat list (the replies that carry jobs).
local function flat(j)
    local out = {}
    for _, name in ipairs(JOB_FIELDS) do
        if j[name] ~= nil then
            out[#out + 1] = name
            out[#out + 1] = j[name]
        end
    end
    return out
end

-- A job as a flat list of fields, as the script leaves it: those Redis holds, then
-- those the script changed (a later name wins; false for one it cleared). No pass
-- over every field: the claim's answer.
local function reply_of(j)
    local out = {unpack(held[j])}
    for _, name in ipairs(changed[j] or {}) do
        out[#out + 1] = name
        out[#out + 1] = j[name] or false
    end
    return out
end

-- Mark the named fields of j as changed (nil ones are deleted); written by done().
local function save(j, names)
    local marks = changed[j]
    if not marks then
        marks = {}
        changed[j] = marks
        to_write[#to_write + 1] = j
    end
    for _, name in ipairs(names) do
        if not marks[name] then
            marks[name] = true
            marks[#marks + 1] = name
        end
    end
end

-- Events of this script, appended by done() under one range of seqs; the jobs it
-- ended, in one "done" message.
local pending_events = {}
local ended = {}
local EVENTS, EVENTS_KEY = {'events'}, P .. 'events'


-- Every script that changes jobs returns through done(): the queues' counts, the
-- events (entry id "<seq>-0", seqs taken in one INCRBY; each job's new seqs join
-- its "events" field), each changed job's one HSET, the "done" message.
local function done(result)
    for q, delta in pairs(queue_delta) do
        if delta ~= 0 and redis.call('HINCRBY', P .. 'queues', q, delta) <= 0 then
            redis.call('HDEL', P .. 'queues', q)
        end
    end
    local count = #pending_events
    local seq = count > 0 and redis.call('INCRBY', P .. 'seq', count) - count
    for _, e in ipairs(pending_events) do
        seq = seq + 1
        local j, s = e[1], string.format('%d', seq)
        redis.call('XADD', EVENTS_KEY, s .. '-0', 'e', e[2])
        j.events = j.events and (j.events .. ',' .. s) or s
        save(j, EVENTS)
        -- A dropped job (see upkeep.lua) keeps its history here, its hash gone.
        if j.dropped then redis.call('HSET', P .. 'dropped', j.id, j.events) end
    end
    zflush()
    for _, j in ipairs(to_write) do
        if not gone[j] and held[j] == FRESH then -- a new job: every field it has
            local set = flat(j)
            set[#set + 1], set[#set + 2] = 'events', j.events
            redis.call('HSET', jkey(j.id), unpack(set))
        elseif not gone[j] then
            local set, del = {}, {}
            for _, name in ipairs(changed[j]) do
                if j[name] ~= nil then
                    set[#set + 1] = name
                    set[#set + 1] = j[name]
                else
                    for i = 1, #held[j], 2 do -- only a field Redis holds is deleted
                        if held[j][i] == name then del[#del + 1] = name end
                    end
                end
            end
            if #set > 0 then redis.call('HSET', jkey(j.id), unpack(set)) end
            if #del > 0 then redis.call('HDEL', jkey(j.id), unpack(del)) end
        end
    end
    if #ended > 0 then redis.call('PUBLISH', P .. 'done', table.concat(ended, ',')) end
    return result
end

-- One event, appended by done(): a JSON array [job id, queue, task, kind, attempt,
-- at, worker, error] in the entry's one field "e", the trailing nulls left out
-- (store.py's _event_of reads it, and the named fields of older entries).
-- (Written by hand: the strings a script repeats, encoded once.)
local encoded = {}
local function enc(x)
    if x == nil then return 'null' end
    local e = encoded[x]
    if not e then
        e = cjson.encode(x)
        encoded[x] = e
    end
    return e
end
-- started: the start of the attempt the event ends (a claim writes no event of
-- its own; event_list in store.py shows it as "claimed").
local function event(j, kind, attempt, at, err, started)
    local tail = ']'
    if started then
        tail = ',' .. enc(j.worker) .. ',' .. (err and cjson.encode(err) or 'null')
            .. ',"' .. started .. '"]'
    elseif err then
        tail = ',' .. enc(j.worker) .. ',' .. cjson.encode(err) .. ']'
    elseif j.worker then
        tail = ',' .. enc(j.worker) .. ']'
    end
    pending_events[#pending_events + 1] = {j, '[' .. j.id .. ',' .. enc(j.queue) .. ',' .. enc(j.task)
        .. ',"' .. kind .. '",' .. string.format('%d', attempt) .. ',"' .. at .. '"' .. tail}
end

local function terminal(state)
    return state == 'succeeded' or state == 'failed' or state == 'cancelled'
end

local function live(state)
    return state == 'queued' or state == 'running' or state == 'waiting'
end

-- Wake-ups: published once per script and channel payload.
local published = {jobs = {}, cancel = {}}
local function publish(channel, payload)
    if published[channel][payload] then return end
    published[channel][payload] = true
    redis.call('PUBLISH', P .. channel, payload)
end

-- Claim order inside ready:<q>: higher priority first, then lower id (made once a job).
local function ready_member(j)
    j.member = j.member
        or string.format('%010d:%016d', 2147483647 - tonumber(j.priority), tonumber(j.id))
    return j.member
end

local function decr(key, field)
    if redis.call('HINCRBY', key, field, -1) <= 0 then redis.call('HDEL', key, field) end
end

-- A queued job in the claim's indexes: ready:<q> when due, else wait:<q>.
local function make_claimable(id, q, run_at, priority, j)
    if NOW and tonumber(run_at) <= NOW then
        zadd(qk('ready', q), 0, ready_member(j or {priority = priority, id = id}))
    else
        zadd(qk('wait', q), run_at, id)
    end
end

-- Jobs met in an index whose hash cannot be read (see upkeep.lua). Scripts with
-- upkeep.lua drop them at once; the others (claim, finish, enqueue, next_run_in)
-- hand them back in ``unreadable`` ({id, queue, state, member, group, key}: where
-- each was met, as JSON), which the store drops right after by job_drop. Returns
-- whether the job was dropped.
local unreadable = {}
local drop = function(id, seen)
    seen.id = tostring(id)
    unreadable[#unreadable + 1] = cjson.encode(seen)
    return false
end

-- Groups: of a group's queued jobs only its head, the oldest, is in the claim's
-- indexes (a claim never walks past a long line of one group), and it starts
-- only while none of the group runs. When the head leaves queued the next one
-- takes its place.
local function group_head(g) return redis.call('ZRANGE', P .. 'gq:' .. g, 0, 0)[1] end

-- The group's head made claimable; a head that cannot be read would hold its
-- group forever: dropped, which promotes the next one.
local function promote_head(g)
    local head = group_head(g)
    local f = head and job_fields(head, 'queue', 'run_at', 'priority')
    if not f then return end
    zflush()
    if not (f[1] and f[2] and f[3]) then
        drop(head, {state = 'queued', group = g})
    elseif not redis.call('ZSCORE', qk('wait', f[1]), head) then
        make_claimable(head, f[1], f[2], f[3])
    end
end

-- A queued job leaves its limit key's line (kq:<q>:<key>); a key with none left
-- leaves kqkeys:<q>. Returns whether the job was in that line.
local function leave_key_line(q, key, id)
    if redis.call('ZREM', kk('kq', q, key), id) == 0 then return false end
    if redis.call('EXISTS', kk('kq', q, key)) == 0 then redis.call('SREM', qk('kqkeys', q), key) end
    return true
end

-- A job with a fair key of its own (fair_key=, not its limit_key; '' for the
-- shared key): a key's line fq:<q>:<key> (and fqkeys:<q>) holds the queued jobs
-- whose own fair key it is, for the fair claim; fqoff:<q> counts per limit key
-- the queued jobs of its line kq: that take turns by another key (fair_status).
local function enter_fair_line(q, j)
    if j.fair_key ~= '' then
        redis.call('ZADD', kk('fq', q, j.fair_key), j.id, j.id)
        redis.call('SADD', qk('fqkeys', q), j.fair_key)
    end
    if j.limit_key then redis.call('HINCRBY', qk('fqoff', q), j.limit_key, 1) end
end

local function leave_fair_line(q, j)
    if j.fair_key ~= '' and redis.call('ZREM', kk('fq', q, j.fair_key), j.id) == 1
            and redis.call('EXISTS', kk('fq', q, j.fair_key)) == 0 then
        redis.call('SREM', qk('fqkeys', q), j.fair_key)
    end
    if j.limit_key and redis.call('HINCRBY', qk('fqoff', q), j.limit_key, -1) <= 0 then
        redis.call('HDEL', qk('fqoff', q), j.limit_key)
    end
end

-- Take a job out of the indexes of the state it is in (before it changes).
local function leave(j)
    local id, q = j.id, j.queue
    zrem(state_key(q, j.state), id)
    if j.batch then decr(P .. 'bcount:' .. j.batch, j.state) end
    if j.state == 'queued' then
        zrem(qk('ready', q), ready_member(j))
        -- A queued job is in ready: or in wait:, never both; one the claim met in
        -- ready: (candidates) is not looked for in wait:.
        if not j.in_ready then zrem(qk('wait', q), id) end
        j.in_ready = nil
        zrem(qk('due', q), id)
        if j.error then zrem(qk('retrying', q), id) end
        if j.group_key then
            redis.call('ZREM', P .. 'gq:' .. j.group_key, id)
            promote_head(j.group_key)
        end
        if j.limit_key then leave_key_line(q, j.limit_key, id) end
        if j.fair_key then leave_fair_line(q, j) end
        if j.expires_at then zrem(P .. 'expiring', id) end
    elseif j.state == 'running' then
        if j.group_key then decr(P .. 'grun', j.group_key) end
        if j.limit_key then decr(qk('krun', q), j.limit_key) end
    elseif j.state ~= 'waiting' then -- a waiting job is in qs:<q>:waiting alone
        zrem(P .. 'finished', id)
        if j.expires_at then zrem(qk('expired', q), id) end -- see job_expire.lua
        if j.retain then zrem(P .. 'retaining', id) end -- see job_purge_retained.lua
    end
end

-- Put a job into the indexes of the state it is now in (after it changed).
local function enter(j)
    local id, q = j.id, j.queue
    if j.batch then redis.call('HINCRBY', P .. 'bcount:' .. j.batch, j.state, 1) end
    if j.state == 'queued' then
        zadd(state_key(q, 'queued'), id, id)
        if j.group_key then redis.call('ZADD', P .. 'gq:' .. j.group_key, id, id) end
        if not j.group_key or group_head(j.group_key) == id then
            make_claimable(id, q, j.run_at, j.priority, j)
        end
        zadd(qk('due', q), j.run_at, id)
        -- Retrying: queued again after a failed attempt.
        if j.error and tonumber(j.attempts) > 0 then
            zadd(qk('retrying', q), j.run_at, id)
        end
        if j.limit_key then
            redis.call('ZADD', kk('kq', q, j.limit_key), id, id)
            redis.call('SADD', qk('kqkeys', q), j.limit_key)
        end
        if j.fair_key then enter_fair_line(q, j) end
        -- A deadline to start by (expires=): the sweep's index (job_expire.lua).
        if j.expires_at then zadd(P .. 'expiring', j.expires_at, id) end
    elseif j.state == 'running' then
        -- By lease expiry: the rescue's range (and ZCARD the count).
        zadd(state_key(q, 'running'), j.lease_expires_at, id)
        if j.group_key then redis.call('HINCRBY', P .. 'grun', j.group_key, 1) end
        if j.limit_key then redis.call('HINCRBY', qk('krun', q), j.limit_key, 1) end
    elseif j.state == 'waiting' then -- for other jobs (flows.lua): in none of the claim's indexes
        zadd(state_key(q, 'waiting'), id, id)
    else
        zadd(state_key(q, j.state), id, id)
        zadd(P .. 'finished', j.finished_at, id)
        -- Its own retention (retain=) for this state: by the moment it is due to go.
        local keep = j.retain and cjson.decode(j.retain)[j.state]
        if keep then zadd(P .. 'retaining', tonumber(j.finished_at) + keep, id) end
    end
end

-- Move a job to another state: out of its indexes, the fields set (name, value,
-- ...; a value false clears the field), into the new state's indexes.
local function move(j, state, ...)
    leave(j)
    local names, fields = {'state'}, {...}
    j.state = state
    for i = 1, #fields, 2 do
        j[fields[i]] = v(fields[i + 1])
        names[#names + 1] = fields[i]
    end
    save(j, names)
    enter(j)
end

-- Whether a queue has limits, read once per script and queue.
local limited_queue = {}
local function is_limited(q)
    if limited_queue[q] == nil then
        limited_queue[q] = redis.call('SISMEMBER', P .. 'limited', q) == 1
    end
    return limited_queue[q]
end

-- A job left queued or running: the next of its group may start (its head's
-- queue is woken), and, when it had run, a limit may let the next job through.
local function wake_group(j)
    local head = j.group_key and group_head(j.group_key)
    if not head then return end
    local q = job_fields(head, 'queue')[1]
    if q then
        publish('jobs', q)
    else
        drop(head, {state = 'queued', group = j.group_key}) -- wakes the next head's queue
    end
end
local function wake_freed(j)
    wake_group(j)
    if j.limit_key or is_limited(j.queue) then publish('jobs', j.queue) end
end

-- The job holding (queue, key) that an enqueue returns instead of inserting:
-- a live one, or with unique "forever" the newest. A holder that cannot be read
-- holds nothing: dropped.
local function find_key(q, key, unique)
    zflush()
    local newest = nil
    -- A window (conveyor/unique.py): "w|<earliest creation time or ''>|<states>": the
    -- newest finished job in those states created since then holds the key too.
    local since, states = nil, nil
    if string.sub(unique, 1, 2) == 'w|' then
        local s, names = string.match(unique, '^w|([^|]*)|(.*)$')
        since, states, unique = tonumber(s), {}, 'forever'
        for name in string.gmatch(names, '[^,]+') do states[name] = true end
    end
    for _, id in ipairs(redis.call('ZREVRANGE', kk('key', q, key), 0, -1)) do
        local f = job_fields(id, 'state', 'created_at')
        local state = f[1]
        local fits = not states or (state and states[state]
            and (not since or tonumber(f[2]) >= since))
        local answers = state and (live(state) or (unique == 'forever' and fits and not newest))
        if not state or (answers and not load(id)) then
            drop(id, {queue = q, key = key})
        elseif live(state) then
            return id
        elseif answers then
            newest = id
        end
    end
    if unique == 'forever' then return newest end
    return nil
end

-- n: {queue, task, args, kwargs, priority, run_at, max_attempts, key, unique,
-- group, batch, limit_key, headers, and for the jobs that use them: expires_at,
-- on_conflict, retain, fair_key}; returns the new job. ``id`` comes from the
-- ids counter (job_insert_many takes a range at once).
local function insert(n, now_s, id)
    id = id or tostring(redis.call('INCR', P .. 'ids'))
    local j = {
        id = id, queue = n[1], task = n[2], state = 'queued', args = n[3], kwargs = n[4],
        priority = n[5], run_at = n[6], attempts = '0', max_attempts = n[7], key = v(n[8]),
        group_key = v(n[10]), batch = v(n[11]), created_at = now_s, limit_key = v(n[12]),
        headers = v(n[13]), expires_at = v(n[14]), retain = v(n[16]), fair_key = v(n[17]),
    }
    cache[id], held[j] = j, FRESH
    save(j, {})
    count_queue(j.queue, 1)
    if j.key then zadd(kk('key', j.queue, j.key), id, id) end
    if j.group_key then zadd(P .. 'group:' .. j.group_key, id, id) end
    if j.batch then zadd(P .. 'batch:' .. j.batch, id, id) end
    enter(j)
    event(j, 'enqueued', 0, now_s, nil)
    publish('jobs', j.queue)
    return j
end

-- ---------------------------------------------------------------------------
-- Ending running jobs: the finish rule (see FinishKind in store/base.py).

-- The fields a finish changes: of a job that ended, of one queued again.
-- (A running job has no result, and keeps an earlier attempt's error unless given one.)
local COMPLETED, ENDED = {'state', 'finished_at', 'result'}, {'state', 'finished_at', 'error'}
local REQUEUED = {'state', 'finished_at', 'run_at', 'error'}
local ATTEMPTS = {'attempts'}
-- The event a finish of each kind records when it queues the job again.
local REQUEUED_AS = {retry = 'retried', snooze = 'snoozed', release = 'released'}

-- items: {id, token, kind, result, error, run_at} each. A stale token (or, for
-- a rescue, a lease that has not run out) changes nothing. Returns the ids
-- changed; their events (named after what became of each job; a rescue that
-- did not queue its job again says how it ended too) in id order.
local function finish_all(items, now_n, now_s)
    local done_jobs = {}
    for _, f in ipairs(items) do
        local j, kind = load(f[1]), f[3]
        if not j then
            drop(f[1], {state = 'running'}) -- gone while it ran: its group and limit go free
        elseif j.state == 'running' and j.lease_token == f[2]
                and (kind ~= 'rescue' or tonumber(j.lease_expires_at) < now_n) then
            local attempts = tonumber(j.attempts)
            local again = kind == 'retry' or kind == 'rescue' or kind == 'take_back'
            local paused = kind == 'snooze' or kind == 'release' -- an attempt that does not count
            local state = 'failed'
            if kind == 'complete' then
                state = 'succeeded'
            elseif j.cancel_requested ~= '1' and (paused or (again and attempts < tonumber(j.max_attempts))) then
                state = 'queued'
            elseif j.cancel_requested == '1' or kind == 'cancelled' then
                state = 'cancelled'
            end
            -- The lease's fields stay: a token is only ever checked with state running.
            leave(j)
            local names = kind == 'complete' and COMPLETED or ENDED
            j.state, j.finished_at = state, now_s
            if state == 'queued' then
                names, j.finished_at = REQUEUED, nil
                j.run_at = v(f[6]) or ((kind == 'rescue' or kind == 'take_back') and now_s) or j.run_at
            end
            if kind == 'complete' then j.result = v(f[4]) end
            j.error = v(f[5]) or j.error
            save(j, names)
            if paused then
                j.attempts = tostring(attempts - 1)
                save(j, ATTEMPTS)
            end
            enter(j)
            if state == 'queued' then publish('jobs', j.queue) else ended[#ended + 1] = j.id end
            wake_freed(j)
            done_jobs[#done_jobs + 1] = {j, kind, tonumber(j.id)}
        end
    end
    table.sort(done_jobs, function(a, b) return a[3] < b[3] end)
    local ids, seconds = {}, {}
    for _, pair in ipairs(done_jobs) do
        local j, kind = pair[1], pair[2]
        local name = REQUEUED_AS[kind] or j.state
        if kind == 'rescue' or kind == 'take_back' then
            name = 'rescued'
            if j.state ~= 'queued' then seconds[#seconds + 1] = j end
        elseif j.state ~= 'queued' then
            name = j.state
        end
        local paused = kind == 'snooze' or kind == 'release'
        local err = nil
        if not paused and kind ~= 'complete' and kind ~= 'cancelled' then err = j.error end
        event(j, name, tonumber(j.attempts) + (paused and 1 or 0), now_s, err, j.started_at)
        ids[#ids + 1] = tonumber(j.id)
    end
    for _, j in ipairs(seconds) do event(j, j.state, tonumber(j.attempts), now_s, j.error) end
    return ids
end

-- ---------------------------------------------------------------------------
-- Flow control (see store/limiting.py and the SQL stores' job_claim_limited).

local function limits_of(q)
    if not is_limited(q) then return nil end
    local raw = redis.call('HGETALL', qk('limit', q))
    local l = {}
    for i = 1, #raw, 2 do l[raw[i]] = tonumber(raw[i + 1]) end
    return l
end

local function started_since(key, since)
    return redis.call('ZCOUNT', key, '(' .. fmt(since), '+inf')
end

-- Room under a limit: how many more jobs (at most ``want``) may start now under
-- the queue's own limit (scope '') or one limit key's (scope 'key_', key given):
-- none while throttled, else what its concurrency and its rate window leave.
local function room(q, l, scope, key, want, now)
    zflush()
    local throttled = l.throttled_until
    local running, starts = state_key(q, 'running'), qk('starts', q)
    if scope == 'key_' then
        throttled = tonumber(redis.call('HGET', qk('kthrottle', q), key))
        running, starts = nil, kk('kstarts', q, key)
    end
    if throttled and throttled > now then return 0 end
    local limit = l[scope .. 'concurrency']
    if limit then
        local n = running and redis.call('ZCARD', running)
            or tonumber(redis.call('HGET', qk('krun', q), key)) or 0
        want = math.min(want, limit - n)
    end
    limit = l[scope .. 'rate']
    if limit then want = math.min(want, limit - started_since(starts, now - l[scope .. 'per'])) end
    return want
end

-- Queued jobs whose run_at has come move from wait:<q> to ready:<q>.
local function promote(q, now)
    local key = qk('wait', q)
    local ids = redis.call('ZRANGEBYSCORE', key, '-inf', fmt(now))
    if #ids == 0 then return end
    local members = {}
    for _, id in ipairs(ids) do
        local prio = job_fields(id, 'priority')[1]
        if prio then
            members[#members + 1] = 0
            members[#members + 1] = ready_member({priority = prio, id = id})
        else
            drop(id, {queue = q, state = 'queued'})
        end
    end
    for i = 1, #members, 2000 do
        redis.call('ZADD', qk('ready', q), unpack(members, i, math.min(i + 1999, #members)))
    end
    for i = 1, #ids, 4000 do redis.call('ZREM', key, unpack(ids, i, math.min(i + 3999, #ids))) end
end

-- Whether a queued job may start now: due, of the asked group, the head of its
-- group with none of it running (and none taken by this claim), within its
-- limit key's room, of which a job that may start takes one (callers take or
-- set aside every job it lets through). ``rooms`` and ``taken_group`` are the
-- claim's.
local function may_start(j, q, l, now, group, rooms, taken_group, limit)
    local g, key = j.group_key, j.limit_key
    if tonumber(j.run_at) > now or (group and g ~= group) then return false end
    if g and (taken_group[g] or (tonumber(redis.call('HGET', P .. 'grun', g)) or 0) > 0
              or group_head(g) ~= j.id) then
        return false
    end
    if l and key then
        if rooms[key] == nil then rooms[key] = room(q, l, 'key_', key, limit, now) end
        -- The key's room goes to the first of its jobs that this claim meets and
        -- that may start: one not due yet or held is never met, so it takes none.
        if rooms[key] <= 0 then return false end
        rooms[key] = rooms[key] - 1
    end
    return true
end

-- Whether a queue is paused, read once per script and queue (a claim that took
-- fewer than it could asks again in next_moment).
local paused_queue = {}
local function is_paused(q)
    if paused_queue[q] == nil then
        paused_queue[q] = redis.call('SISMEMBER', P .. 'paused', q) == 1
    end
    return paused_queue[q]
end

-- The jobs a claim would take: {id, priority, queue, job} in claim order, at most
-- ``limit``: queued jobs that may start, of queues not paused, within each
-- queue's own room.
local function candidates(queues, limit, now, group)
    zflush()
    local found, seen_queue, taken_group = {}, {}, {}
    for _, q in ipairs(queues) do
        if not seen_queue[q] and not is_paused(q) then
            seen_queue[q] = true
            promote(q, now)
            local l = limits_of(q)
            local want = l and room(q, l, '', nil, limit, now) or limit
            local rooms, unread = {}, {}
            -- Read as many entries as are wanted (more when some are passed over):
            -- each one read is a string to copy out of Redis.
            local got, start, chunk = 0, 0, math.max(want, 1)
            while got < want do
                local members = redis.call('ZRANGE', qk('ready', q), start, start + chunk - 1)
                if #members == 0 then break end
                local last = #members < chunk -- the end of ready: (no read more to say so)
                start, chunk = start + chunk, math.min(chunk * 2, 1000)
                for _, m in ipairs(members) do
                    local j = load(tonumber(string.sub(m, 12)))
                    if j then j.member, j.in_ready = m, true end
                    if not j then
                        unread[#unread + 1] = m
                    elseif j.expires_at and tonumber(j.expires_at) <= now then
                        -- Past its deadline: never started; job_expire.lua ends it.
                    elseif may_start(j, q, l, now, group, rooms, taken_group, limit) then
                        if j.group_key then taken_group[j.group_key] = true end
                        found[#found + 1] = {tonumber(j.id), tonumber(j.priority), q, j}
                        got = got + 1
                        if got >= want then break end
                    end
                end
                if last then break end
            end
            -- Dropped after the walk, which reads ready: by rank.
            for _, m in ipairs(unread) do
                drop(tostring(tonumber(string.sub(m, 12))), {queue = q, state = 'queued', member = m})
            end
        end
    end
    if #queues > 1 then -- one queue's walk is in claim order already
        table.sort(found, function(a, b)
            if a[2] ~= b[2] then return a[2] > b[2] end
            return a[1] < b[1]
        end)
    end
    while #found > limit do table.remove(found) end
    return found
end

-- Starts older than every window of the queue (and :slack seconds more) are forgotten.
local function prune_starts(q, l, now, slack)
    local horizon = '(' .. fmt(now - slack - math.max(l and l.per or 0, l and l.key_per or 0))
    redis.call('ZREMRANGEBYSCORE', qk('starts', q), '-inf', horizon)
    for _, key in ipairs(redis.call('SMEMBERS', qk('kstartkeys', q))) do
        redis.call('ZREMRANGEBYSCORE', kk('kstarts', q, key), '-inf', horizon)
        if redis.call('EXISTS', kk('kstarts', q, key)) == 0 then
            redis.call('SREM', qk('kstartkeys', q), key)
        end
    end
end

-- A start of job j of limited queue q at now_s, for the rates that count it.
local function record_start(q, j, now_s)
    local mark = tostring(redis.call('INCR', P .. 'startseq'))
    redis.call('ZADD', qk('starts', q), now_s, mark)
    if j.limit_key then
        redis.call('ZADD', kk('kstarts', q, j.limit_key), now_s, mark)
        redis.call('SADD', qk('kstartkeys', q), j.limit_key)
    end
end

-- A queue left with no limit and no throttle goes back to the plain claim.
local function forget_if_empty(q, now)
    local l = limits_of(q)
    if not l or l.rate or l.concurrency or l.key_rate or l.key_concurrency then return end
    if l.throttled_until and l.throttled_until > now then return end
    for _, until_ in ipairs(redis.call('HVALS', qk('kthrottle', q))) do
        if tonumber(until_) > now then return end
    end
    redis.call('DEL', qk('limit', q), qk('kthrottle', q))
    redis.call('SREM', P .. 'limited', q)
    limited_queue[q] = false
end

-- ---------------------------------------------------------------------------
-- Claiming: job_claim, and job_finish when it fetches the next jobs for the
-- slots its outcomes free (the same rule, written once).

local CLAIMED = {'state', 'attempts', 'worker', 'lease_token', 'lease_expires_at', 'started_at'}

-- Starts queued job j: running under lease ``token`` for ``worker`` until
-- ``expires``, its indexes moved, an earlier attempt's progress cleared.
local function start_job(j, worker, token, expires, now_s)
    leave(j)
    j.state, j.attempts, j.worker = 'running', tostring(tonumber(j.attempts) + 1), worker
    j.lease_token, j.lease_expires_at, j.started_at = token, expires, now_s
    save(j, CLAIMED)
    enter(j)
    if j.progress or j.progress_message then -- an earlier attempt's
        j.progress, j.progress_message = nil, nil
        save(j, {'progress', 'progress_message'})
    end
end

-- Moves up to ``limit`` jobs that may start (see candidates) to running under
-- lease ``token`` for ``worker`` until ``expires`` (a time string); a limited
-- queue records its starts for the rates (and forgets those older than every
-- window and ``slack`` seconds more). Returns the jobs, in claim order, as flat
-- lists of fields.
local function claim(queues, limit, worker, token, expires, now_n, now_s, group, slack)
    local out, limited = {}, {}
    for _, c in ipairs(candidates(queues, limit, now_n, group)) do
        local j, q = c[4], c[3]
        start_job(j, worker, token, expires, now_s)
        if limited[q] == nil then limited[q] = limits_of(q) or false end
        local l = limited[q]
        if l and (l.rate or l.key_rate) then record_start(q, j, now_s) end
        out[#out + 1] = reply_of(j)
    end
    for q, l in pairs(limited) do
        if l then prune_starts(q, l, now_n, slack) end
    end
    return out
end

-- The next moment a claim on ``queues`` could start a job that it cannot now
-- (the SQL stores' next_run_at): the next queued job's run_at; for a queue
-- with limits, a throttle's end, the moment a full rate window lets the next
-- job through, or now when a claim would take a job already. Returns {now,
-- moment} as strings, or {now} when there is none (next_run_in, and a claim
-- that took fewer than it could, which answers it in the same script).
local function nth_newest(key, n, since)
    local row = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(' .. fmt(since), 'WITHSCORES',
                           'LIMIT', n - 1, 1)
    return tonumber(row[2])
end
local function next_moment(queues, now_n, now_s, group)
    zflush() -- reads due: and the limits' sets
    local best = nil
    local function consider(at)
        if at and (best == nil or at < best) then best = at end
    end
    for _, q in ipairs(queues) do
        if not is_paused(q) then
            local row = redis.call('ZRANGEBYSCORE', qk('due', q), '(' .. now_s, '+inf',
                                   'WITHSCORES', 'LIMIT', 0, 1)
            consider(tonumber(row[2]))
            local l = limits_of(q)
            if l then
                if #candidates({q}, 1, now_n, group) > 0 then consider(now_n) end
                if l.throttled_until and l.throttled_until > now_n then
                    consider(l.throttled_until)
                else
                    for _, until_ in ipairs(redis.call('HVALS', qk('kthrottle', q))) do
                        if tonumber(until_) > now_n then consider(tonumber(until_)) end
                    end
                    if l.rate and started_since(qk('starts', q), now_n - l.per) >= l.rate then
                        consider(nth_newest(qk('starts', q), l.rate, now_n - l.per) + l.per)
                    end
                    if l.key_rate then
                        for _, key in ipairs(redis.call('SMEMBERS', qk('kstartkeys', q))) do
                            local skey = kk('kstarts', q, key)
                            if started_since(skey, now_n - l.key_per) >= l.key_rate then
                                consider(nth_newest(skey, l.key_rate, now_n - l.key_per)
                                         + l.key_per)
                            end
                        end
                    end
                end
            end
        end
    end
    local answer = {now_s}
    if best ~= nil then answer[2] = fmt(best) end
    return answer
end

-- Shared by every script of the Redis store: the store prepends this file to
-- each operation's script when it loads it (one EVALSHA per call, nothing
-- shared at run time). What only maintenance and the operators' actions need
-- is in upkeep.lua: each function defined here is made anew on every run of
-- every script (11 µs of a claim's), the hot ones included.
--
-- KEYS[1] is the key prefix, e.g. "{conveyor}:"; its hash tag puts every key
-- in one cluster slot, so that a script may touch any of them.
--
-- Values cross from Python as strings: times are epoch seconds written with
-- six decimals (never through Lua's number formatting, which keeps 14 digits),
-- and JSON arrays carry strings or null.
--
-- Layout (see docs/architecture.md):
--   job:<id>                 hash, one job (fields named like the SQL columns, and
--                            "events": the seqs of its events, comma-separated)
--   ids, seq                 counters of job ids and event seqs
--   events                   stream, entry id "<seq>-0"
--   queues                   hash queue -> number of jobs; paused: set of queues
--   qs:<q>:<state>           zset of the ids of a queue in a state (stats are ZCARDs)
--   wait:<q>, ready:<q>      queued jobs not due when they were queued (by run_at),
--                            until a claim finds them due / due ones in claim order
--                            (score 0, member "<prio>:<id>")
--   due:<q>, retrying:<q>    queued jobs by run_at / those after a failed attempt
--   gq:<g>, grun             queued jobs of a group (by id) / running jobs per group
--   group:<g>, batch:<b>     every job of a group, of a batch; bcount:<b> state -> n
--   key:<q>:<k>              every job holding an idempotency key
--   finished, leases         terminal jobs by finished_at / running ones by lease expiry
--   limited, limit:<q>       queues with limits, and their limits (hash)
--   starts:<q>, kstarts:<q>:<k>, krun:<q>, kq:<q>:<k>, kqkeys:<q>, kthrottle:<q>
--                            flow control: starts in the rate windows, running and
--                            queued jobs per limit key, key throttles
--   lost, lost:sweeping      hash id -> state: jobs dropped because their hash could
--                            not be read, until the sweep has walked every key
--   dropped, dropped:at      hash id -> its events' seqs (its history), zset id by the
--                            time it was dropped: until retention purges them
-- A queue name inside a key is written "<length>.<name>", so that names with
-- colons never collide.
--
-- With the append-only file on, every write a script makes is one more entry
-- to log: the layout keeps them few (no index that a read could do without,
-- counters of a script added up once, at its end, by done()).

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
    if arg ~= nil and arg ~= '' then
        NOW = tonumber(arg)
        return NOW, arg
    end
    local t = redis.call('TIME')
    local s = string.format('%d.%06d', tonumber(t[1]), tonumber(t[2]))
    NOW = tonumber(s)
    return NOW, s
end

-- Jobs per queue, changed by this script: written once, by done().
local queue_delta = {}
local function count_queue(q, delta) queue_delta[q] = (queue_delta[q] or 0) + delta end

local function jkey(id) return P .. 'job:' .. id end
local function kk(what, q, key) return P .. what .. ':' .. nm(q) .. ':' .. key end

-- Key names of a queue, made once per script (each job moved needs several).
local queue_keys = {}
local function qk(what, q)
    local of_queue = queue_keys[q]
    if not of_queue then
        of_queue = {}
        queue_keys[q] = of_queue
    end
    local key = of_queue[what]
    if not key then
        key = P .. what .. ':' .. nm(q)
        of_queue[what] = key
    end
    return key
end
-- qs:<q>:<state>, the ids of a queue's jobs in one state.
local state_keys = {}
local function state_key(q, state)
    local of_queue = state_keys[q]
    if not of_queue then
        of_queue = {}
        state_keys[q] = of_queue
    end
    local key = of_queue[state]
    if not key then
        key = qk('qs', q) .. ':' .. state
        of_queue[state] = key
    end
    return key
end

local JOB_FIELDS = {
    'id', 'queue', 'task', 'state', 'args', 'kwargs', 'priority', 'run_at', 'attempts',
    'max_attempts', 'key', 'group_key', 'batch', 'worker', 'lease_token', 'lease_expires_at',
    'cancel_requested', 'result', 'error', 'progress', 'progress_message', 'created_at',
    'started_at', 'finished_at', 'limit_key', 'headers',
}
-- Besides these a job's hash holds "events", the seqs of its events joined by
-- commas (its history, and what a delete removes from the stream).


-- A job's changes reach Redis once, at done(): one HSET with every field the
-- script changed, events included. Until then the script reads its own
-- changes from here: every read of a job goes through load() or job_fields().
local cache = {}    -- id -> job, read or made by this script
local held = {}     -- job -> its fields as Redis holds them: HGETALL's flat reply
local changed = {}  -- job -> names saved since, in order (a list, and a set)
local to_write = {} -- jobs with changes, in the order they were first saved
local gone = {}     -- jobs deleted by this script

-- A job as this script sees it; nil when its hash is gone (deleted by hand,
-- evicted) or lacks a field every job has (REQUIRED in upkeep.lua; the others
-- are absent when unset): such a job is dropped (see drop) by the callers that
-- meet it in an index. The fields are spelled out: a loop over a list would
-- cost each read three times as much (0.4 against 0.15 µs).
local function load(id)
    id = tostring(id)
    local j = cache[id]
    if j then return j end
    local flat = redis.call('HGETALL', jkey(id))
    if #flat == 0 then return nil end
    j = {}
    for i = 1, #flat, 2 do j[flat[i]] = flat[i + 1] end
    if not (j.id and j.queue and j.task and j.state and j.args and j.kwargs and j.priority
            and j.run_at and j.attempts and j.max_attempts and j.created_at) then
        return nil
    end
    cache[id], held[j] = j, flat
    return j
end

-- Some fields of a job, seen as this script left them.
local function job_fields(id, ...)
    local j = cache[tostring(id)]
    if not j then return redis.call('HMGET', jkey(id), ...) end
    local out = {}
    for i, name in ipairs({...}) do out[i] = j[name] or false end
    return out
end

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

-- Whether Redis holds a field of a job (a scan of HGETALL's reply: cheaper
-- than a second table per job, and only needed for fields to delete).
local function holds(j, name)
    local flat = held[j]
    for i = 1, #flat, 2 do
        if flat[i] == name then return true end
    end
    return false
end

-- The fields a script changed, as a flat list after the job's stored ones
-- (a later name wins; false, a nil reply, for a field it deleted): a reply
-- that needs no pass over every field.
local function reply_of(j)
    local out = {unpack(held[j])}
    for _, name in ipairs(changed[j] or {}) do
        out[#out + 1] = name
        out[#out + 1] = j[name] or false
    end
    return out
end

-- Write what each job changed: one HSET (and an HDEL for fields that were
-- there and are now gone).
local function write_jobs()
    for _, j in ipairs(to_write) do
        if not gone[j] then
            local set, del = {}, {}
            for _, name in ipairs(changed[j]) do
                local value = j[name]
                if value ~= nil then
                    set[#set + 1] = name
                    set[#set + 1] = value
                elseif holds(j, name) then
                    del[#del + 1] = name
                end
            end
            if #set > 0 then redis.call('HSET', jkey(j.id), unpack(set)) end
            if #del > 0 then redis.call('HDEL', jkey(j.id), unpack(del)) end
        end
    end
end

-- Events of this script, appended by done() under one range of seqs.
local pending_events = {}
-- Jobs this script ended: one "done" message, by done().
local ended = {}

-- Every script that changes jobs returns through done(): it appends the
-- script's events to the stream (entry id "<seq>-0", seqs taken in one INCRBY),
-- writes the jobs' changes (each job's new seqs with them) and its counters.
local function done(result)
    for q, delta in pairs(queue_delta) do
        if delta ~= 0 and redis.call('HINCRBY', P .. 'queues', q, delta) <= 0 then
            redis.call('HDEL', P .. 'queues', q)
        end
    end
    local count = #pending_events
    if count > 0 then
        local seq = redis.call('INCRBY', P .. 'seq', count) - count
        for _, e in ipairs(pending_events) do
            seq = seq + 1
            local j, s = e[1], string.format('%d', seq)
            redis.call('XADD', P .. 'events', s .. '-0', unpack(e[2]))
            j.events = j.events and (j.events .. ',' .. s) or s
            save(j, {'events'})
            -- A dropped job (see upkeep.lua) keeps its history here, its hash gone.
            if j.dropped then redis.call('HSET', P .. 'dropped', j.id, j.events) end
        end
    end
    write_jobs()
    if #ended > 0 then redis.call('PUBLISH', P .. 'done', table.concat(ended, ',')) end
    return result
end

local function terminal(state)
    return state == 'succeeded' or state == 'failed' or state == 'cancelled'
end

local function live(state)
    return state == 'queued' or state == 'running' or state == 'waiting'
end

-- Claim order inside ready:<q>: higher priority first, then lower id.
local function ready_member(j)
    return string.format('%010d:%016d', 2147483647 - tonumber(j.priority), tonumber(j.id))
end

local function decr(key, field)
    if redis.call('HINCRBY', key, field, -1) <= 0 then redis.call('HDEL', key, field) end
end

-- A queued job in the claim's indexes: ready:<q> when due, else wait:<q>.
local function make_claimable(id, q, run_at, priority)
    if NOW and tonumber(run_at) <= NOW then
        redis.call('ZADD', qk('ready', q), 0, ready_member({priority = priority, id = id}))
    else
        redis.call('ZADD', qk('wait', q), run_at, id)
    end
end

-- Jobs met in an index whose hash cannot be read (see upkeep.lua). The scripts
-- that prepend upkeep.lua drop them at once; the others (the claim, finish and
-- enqueue) hand them back with their answer, in ``unreadable``: one JSON object
-- ({id, queue, state, member, group, key}: where it was met) each, which the
-- store drops right after by job_drop. Returns whether the job was dropped.
local unreadable = {}
local drop = function(id, seen)
    seen.id = tostring(id)
    unreadable[#unreadable + 1] = cjson.encode(seen)
    return false
end

-- Of a group's queued jobs only the oldest (its head) is in the claim's
-- indexes, so that a claim never walks past a long line of one group. The head
-- changes when it leaves queued: the next one takes its place.
local function promote_head(group)
    local head = redis.call('ZRANGE', P .. 'gq:' .. group, 0, 0)[1]
    if not head then return end
    local f = job_fields(head, 'queue', 'run_at', 'priority')
    if not (f[1] and f[2] and f[3]) then
        -- A head that cannot be read would hold its group forever: dropping it
        -- takes it out of the group's line and promotes the next one.
        drop(head, {state = 'queued', group = group})
        return
    end
    if redis.call('ZSCORE', qk('wait', f[1]), head) then return end
    make_claimable(head, f[1], f[2], f[3])
end

-- A queued job leaves its limit key's line (kq:<q>:<key>); a key with none left
-- leaves kqkeys:<q>. Returns whether the job was in that line.
local function leave_key_line(q, key, id)
    if redis.call('ZREM', kk('kq', q, key), id) == 0 then return false end
    if redis.call('EXISTS', kk('kq', q, key)) == 0 then
        redis.call('SREM', qk('kqkeys', q), key)
    end
    return true
end

-- Take a job out of the indexes of the state it is in (before it changes).
local function leave(j)
    local id, q = j.id, j.queue
    redis.call('ZREM', state_key(q, j.state), id)
    if j.batch then decr(P .. 'bcount:' .. j.batch, j.state) end
    if j.state == 'queued' then
        redis.call('ZREM', qk('ready', q), ready_member(j))
        redis.call('ZREM', qk('wait', q), id)
        redis.call('ZREM', qk('due', q), id)
        redis.call('ZREM', qk('retrying', q), id)
        if j.group_key then
            redis.call('ZREM', P .. 'gq:' .. j.group_key, id)
            promote_head(j.group_key)
        end
        if j.limit_key then leave_key_line(q, j.limit_key, id) end
    elseif j.state == 'running' then
        redis.call('ZREM', P .. 'leases', id)
        if j.group_key then decr(P .. 'grun', j.group_key) end
        if j.limit_key then decr(qk('krun', q), j.limit_key) end
    else
        redis.call('ZREM', P .. 'finished', id)
    end
end

-- Put a job into the indexes of the state it is now in (after it changed).
local function enter(j)
    local id, q = j.id, j.queue
    redis.call('ZADD', state_key(q, j.state), id, id)
    if j.batch then redis.call('HINCRBY', P .. 'bcount:' .. j.batch, j.state, 1) end
    if j.state == 'queued' then
        -- Due now: ready at once; due later: a claim moves it once its run_at has
        -- come. A job of a group only when it is the group's head.
        local claimable = true
        if j.group_key then
            redis.call('ZADD', P .. 'gq:' .. j.group_key, id, id)
            claimable = redis.call('ZRANGE', P .. 'gq:' .. j.group_key, 0, 0)[1] == id
        end
        if claimable then make_claimable(id, q, j.run_at, j.priority) end
        redis.call('ZADD', qk('due', q), j.run_at, id)
        if j.error and tonumber(j.attempts) > 0 then
            redis.call('ZADD', qk('retrying', q), j.run_at, id)
        end
        if j.limit_key then
            redis.call('ZADD', kk('kq', q, j.limit_key), id, id)
            redis.call('SADD', qk('kqkeys', q), j.limit_key)
        end
    elseif j.state == 'running' then
        redis.call('ZADD', P .. 'leases', j.lease_expires_at, id)
        if j.group_key then redis.call('HINCRBY', P .. 'grun', j.group_key, 1) end
        if j.limit_key then redis.call('HINCRBY', qk('krun', q), j.limit_key, 1) end
    else
        redis.call('ZADD', P .. 'finished', j.finished_at, id)
    end
end

-- One event, appended to the stream by done() (in the order they were made).
local function event(j, kind, attempt, at, err)
    local fields = {
        'job_id', j.id, 'queue', j.queue, 'task', j.task, 'kind', kind,
        'attempt', tostring(attempt), 'at', at,
    }
    if j.worker then
        fields[#fields + 1] = 'worker'
        fields[#fields + 1] = j.worker
    end
    if err then
        fields[#fields + 1] = 'error'
        fields[#fields + 1] = err
    end
    pending_events[#pending_events + 1] = {j, fields}
end

-- Wake-ups: published once per script and channel payload.
local published = {}
local function publish(channel, payload)
    local mark = channel .. '\0' .. payload
    if published[mark] then return end
    published[mark] = true
    redis.call('PUBLISH', P .. channel, payload)
end

-- A job of a group left queued or running: the group's next job may start.
local function wake_group(j)
    if not j.group_key then return end
    local head = redis.call('ZRANGE', P .. 'gq:' .. j.group_key, 0, 0)[1]
    if head then
        local q = job_fields(head, 'queue')[1]
        if q then
            publish('jobs', q)
        else
            drop(head, {state = 'queued', group = j.group_key}) -- wakes the next head's queue
        end
    end
end

-- Whether a queue has limits, read once per script and queue.
local limited_queue = {}
local function is_limited(q)
    local known = limited_queue[q]
    if known == nil then
        known = redis.call('SISMEMBER', P .. 'limited', q) == 1
        limited_queue[q] = known
    end
    return known
end

-- A job that ran ended or went back: a group or a limit may let the next one start.
local function wake_freed(j)
    wake_group(j)
    if j.limit_key or is_limited(j.queue) then publish('jobs', j.queue) end
end

-- The job holding (queue, key) that an enqueue returns instead of inserting. A
-- holder that cannot be read holds nothing: dropped.
local function find_key(q, key, unique)
    local newest = nil
    for _, id in ipairs(redis.call('ZREVRANGE', kk('key', q, key), 0, -1)) do
        local state = job_fields(id, 'state')[1]
        local answers = state and (live(state) or (unique == 'forever' and not newest))
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
-- group, batch, limit_key, headers}; returns the new job.
-- ``id`` comes from the ids counter (job_insert_many takes a range at once).
local function insert(n, now_s, id)
    id = id or tostring(redis.call('INCR', P .. 'ids'))
    local j = {
        id = id, queue = n[1], task = n[2], state = 'queued', args = n[3], kwargs = n[4],
        priority = n[5], run_at = n[6], attempts = '0', max_attempts = n[7], key = v(n[8]),
        group_key = v(n[10]), batch = v(n[11]), cancel_requested = '0', created_at = now_s,
        limit_key = v(n[12]), headers = v(n[13]),
    }
    cache[id], held[j] = j, {} -- a new id: nothing stored yet
    save(j, JOB_FIELDS)
    count_queue(j.queue, 1)
    if j.key then redis.call('ZADD', kk('key', j.queue, j.key), id, id) end
    if j.group_key then redis.call('ZADD', P .. 'group:' .. j.group_key, id, id) end
    if j.batch then redis.call('ZADD', P .. 'batch:' .. j.batch, id, id) end
    enter(j)
    event(j, 'enqueued', 0, now_s, nil)
    publish('jobs', j.queue)
    return j
end

-- ---------------------------------------------------------------------------
-- Ending running jobs (job_finish's rule; see FinishKind in store/base.py).

-- f: {id, token, kind, result, error, run_at}. Returns the job changed, or nil
-- when the lease no longer holds (or, for a rescue, has not run out).
local function finish_one(f, now_n, now_s)
    local j = load(f[1])
    if not j then
        drop(f[1], {state = 'running'}) -- gone while it ran: its group and limit go free
        return nil
    end
    if j.state ~= 'running' or j.lease_token ~= f[2] then return nil end
    local kind = f[3]
    if kind == 'rescue' and not (tonumber(j.lease_expires_at) < now_n) then return nil end
    local cancel = j.cancel_requested == '1'
    local attempts = tonumber(j.attempts)
    local again = kind == 'retry' or kind == 'rescue' or kind == 'take_back'
    local requeue = not cancel and (kind == 'snooze' or kind == 'release'
        or (again and attempts < tonumber(j.max_attempts)))
    leave(j)
    if kind == 'complete' then
        j.state = 'succeeded'
    elseif requeue then
        j.state = 'queued'
    elseif cancel or kind == 'cancelled' then
        j.state = 'cancelled'
    else
        j.state = 'failed'
    end
    if requeue then
        local when = v(f[6])
        if not when and (kind == 'rescue' or kind == 'take_back') then when = now_s end
        j.run_at = when or j.run_at
        j.finished_at = nil
    else
        j.finished_at = now_s
    end
    if kind == 'snooze' or kind == 'release' then attempts = attempts - 1 end
    j.attempts = tostring(attempts)
    if kind == 'complete' then j.result = v(f[4]) end
    if v(f[5]) then j.error = f[5] end
    j.lease_token, j.lease_expires_at = nil, nil
    save(j, {'state', 'run_at', 'finished_at', 'attempts', 'result', 'error', 'lease_token',
             'lease_expires_at'})
    enter(j)
    if j.state == 'queued' then
        publish('jobs', j.queue)
    else
        ended[#ended + 1] = j.id
    end
    wake_freed(j)
    return j
end

-- The events of the finished jobs, as event_insert_finished writes them: one
-- per job named after what became of it, then, for rescues that did not queue
-- the job again, how it ended.
local function finish_events(done, now_s)
    table.sort(done, function(a, b) return tonumber(a[1].id) < tonumber(b[1].id) end)
    local seconds = {}
    for _, pair in ipairs(done) do
        local j, kind = pair[1], pair[2]
        local name
        if kind == 'rescue' or kind == 'take_back' then
            name = 'rescued'
            if j.state ~= 'queued' then seconds[#seconds + 1] = j end
        elseif j.state ~= 'queued' then
            name = j.state
        elseif kind == 'retry' then
            name = 'retried'
        elseif kind == 'snooze' then
            name = 'snoozed'
        else
            name = 'released'
        end
        local attempt = tonumber(j.attempts)
        if kind == 'snooze' or kind == 'release' then attempt = attempt + 1 end
        local err = nil
        if kind == 'retry' or kind == 'fail' or kind == 'rescue' or kind == 'take_back' then
            err = j.error
        end
        event(j, name, attempt, now_s, err)
    end
    for _, j in ipairs(seconds) do event(j, j.state, tonumber(j.attempts), now_s, j.error) end
end

local function finish_all(items, now_n, now_s)
    local done, ids = {}, {}
    for _, f in ipairs(items) do
        local j = finish_one(f, now_n, now_s)
        if j then
            done[#done + 1] = {j, f[3]}
            ids[#ids + 1] = tonumber(j.id)
        end
    end
    finish_events(done, now_s)
    return ids
end

-- ---------------------------------------------------------------------------
-- Flow control (see store/limiting.py and the SQL stores' job_claim_limited).

local function limits_of(q)
    if redis.call('SISMEMBER', P .. 'limited', q) == 0 then return nil end
    local raw = redis.call('HGETALL', qk('limit', q))
    local l = {}
    for i = 1, #raw, 2 do l[raw[i]] = tonumber(raw[i + 1]) end
    return l
end

local function started_since(key, since)
    return redis.call('ZCOUNT', key, '(' .. fmt(since), '+inf')
end

-- How many more jobs the queue's own limit lets start now.
local function queue_allowance(q, l, limit, now)
    local allow = limit
    if l.throttled_until and l.throttled_until > now then return 0 end
    if l.concurrency then
        allow = math.min(allow, l.concurrency - redis.call('ZCARD', state_key(q, 'running')))
    end
    if l.rate then
        allow = math.min(allow, l.rate - started_since(qk('starts', q), now - l.per))
    end
    return allow
end

-- How many more jobs of one limit key may start now.
local function key_room(q, l, key, limit, now)
    local until_ = tonumber(redis.call('HGET', qk('kthrottle', q), key))
    if until_ and until_ > now then return 0 end
    local room = limit
    if l.key_concurrency then
        local running = tonumber(redis.call('HGET', qk('krun', q), key)) or 0
        room = math.min(room, l.key_concurrency - running)
    end
    if l.key_rate then
        room = math.min(room, l.key_rate - started_since(kk('kstarts', q, key), now - l.key_per))
    end
    return room
end

-- Queued jobs whose run_at has come move from wait:<q> to ready:<q>.
local function promote(q, now)
    local key = qk('wait', q)
    local ids = redis.call('ZRANGEBYSCORE', key, '-inf', fmt(now))
    if #ids == 0 then return end
    local members, unread = {}, {}
    for _, id in ipairs(ids) do
        local prio = job_fields(id, 'priority')[1]
        if prio then
            members[#members + 1] = 0
            members[#members + 1] = ready_member({priority = prio, id = id})
        else
            unread[#unread + 1] = id
        end
    end
    for i = 1, #members, 2000 do
        redis.call('ZADD', qk('ready', q), unpack(members, i, math.min(i + 1999, #members)))
    end
    for i = 1, #ids, 4000 do
        redis.call('ZREM', key, unpack(ids, i, math.min(i + 3999, #ids)))
    end
    for _, id in ipairs(unread) do drop(id, {queue = q, state = 'queued'}) end
end

-- The jobs a claim would take: {id, priority, queue, job} in claim order, at most
-- ``limit``. Ready: queued, due, queue not paused, the oldest queued job of a
-- group with no running job, and within the queue's and its key's limits.
local function candidates(queues, limit, now, group)
    local found = {}
    local seen_queue, taken_group = {}, {}
    for _, q in ipairs(queues) do
        if not seen_queue[q] and redis.call('SISMEMBER', P .. 'paused', q) == 0 then
            seen_queue[q] = true
            promote(q, now)
            local l = limits_of(q)
            local want = limit
            if l then want = queue_allowance(q, l, limit, now) end
            local rooms, unread = {}, {}
            -- Read as many entries as are wanted (more when some are passed over):
            -- each one read is a string to copy out of Redis.
            local got, start = 0, 0
            local chunk = math.max(want, 1)
            while got < want do
                local members = redis.call('ZRANGE', qk('ready', q), start, start + chunk - 1)
                if #members == 0 then break end
                start = start + chunk
                chunk = math.min(chunk * 2, 1000)
                for _, m in ipairs(members) do
                    local id = tostring(tonumber(string.sub(m, 12)))
                    -- The whole job, which the claim then moves without reading it again.
                    local j = load(id)
                    if not j then unread[#unread + 1] = m end
                    local ok = j and tonumber(j.run_at) <= now
                    local g, key = j and j.group_key, j and j.limit_key
                    if ok and group and g ~= group then ok = false end
                    if ok and g then
                        ok = not taken_group[g]
                            and (tonumber(redis.call('HGET', P .. 'grun', g)) or 0) <= 0
                            and redis.call('ZRANGE', P .. 'gq:' .. g, 0, 0)[1] == id
                    end
                    if ok and l and key then
                        local room = rooms[key]
                        if room == nil then
                            room = key_room(q, l, key, limit, now)
                            rooms[key] = room
                        end
                        -- One of its key's oldest queued jobs, as many as the key has room for.
                        ok = room > 0
                            and redis.call('ZCOUNT', kk('kq', q, key), '-inf', '(' .. id) < room
                    end
                    if ok then
                        if g then taken_group[g] = true end
                        found[#found + 1] = {tonumber(id), tonumber(j.priority), q, j}
                        got = got + 1
                        if got >= want then break end
                    end
                end
            end
            -- Dropped after the walk, which reads ready: by rank.
            for _, m in ipairs(unread) do
                local id = tostring(tonumber(string.sub(m, 12)))
                drop(id, {queue = q, state = 'queued', member = m})
            end
        end
    end
    table.sort(found, function(a, b)
        if a[2] ~= b[2] then return a[2] > b[2] end
        return a[1] < b[1]
    end)
    while #found > limit do table.remove(found) end
    return found
end

-- Starts older than every window of the queue (and :slack seconds more) are forgotten.
local function prune_starts(q, l, now, slack)
    local horizon = fmt(now - slack - math.max(l and l.per or 0, l and l.key_per or 0))
    redis.call('ZREMRANGEBYSCORE', qk('starts', q), '-inf', '(' .. horizon)
    for _, key in ipairs(redis.call('SMEMBERS', qk('kstartkeys', q))) do
        redis.call('ZREMRANGEBYSCORE', kk('kstarts', q, key), '-inf', '(' .. horizon)
        if redis.call('EXISTS', kk('kstarts', q, key)) == 0 then
            redis.call('SREM', qk('kstartkeys', q), key)
        end
    end
end

-- A queue left with no limit and no throttle goes back to the plain claim.
local function forget_if_empty(q, now)
    local l = limits_of(q)
    if not l then return end
    if l.rate or l.concurrency or l.key_rate or l.key_concurrency then return end
    if l.throttled_until and l.throttled_until > now then return end
    for _, until_ in ipairs(redis.call('HVALS', qk('kthrottle', q))) do
        if tonumber(until_) > now then return end
    end
    redis.call('DEL', qk('limit', q), qk('kthrottle', q))
    redis.call('SREM', P .. 'limited', q)
end

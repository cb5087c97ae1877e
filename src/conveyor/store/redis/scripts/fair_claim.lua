-- name: fair_claim
-- ARGV: queue, limit, worker, token, lease seconds, now ('' = Redis's clock),
-- group ('' = any), slack seconds (of the limits' starts).
-- The claim of a fair queue (see conveyor.store.fair, and fair_claim on
-- PostgreSQL for the rule): weighted fair queueing by start tags. Key k's turn
-- stands at pass(k); its i-th ready job would start at pass(k) + i/weight(k); the
-- claim takes the jobs with the smallest tags (of the jobs read, the highest
-- priority first), so that keys alternate by weight. A key that comes (back)
-- starts at the queue's clock, never behind it. A queue with limits keeps them
-- as the plain claim does: its room caps the claim, each key's room its jobs, and
-- the starts are recorded for the rates.
--
-- A job takes turns by its own fair key (field fair_key, '' for the shared key),
-- else its limit_key; the per-key limits count by limit_key whatever the fair
-- key. A key's jobs are its line kq:<q>:<key> (every queued job with a limit key
-- is in one, oldest first; those with a fair key of their own passed over) and
-- its line fq:<q>:<key> (the jobs whose own fair key it is), read lazily: the keys are ranked by their next tag and
-- a key is opened only while its next tag could be among the :limit smallest.
-- The jobs without a key are looked for at the head of ready:<q> alone.
-- fair:<q> holds the settings (weights JSON, default, clock); fturn:<q> one field
-- per key ('' for no key): "pass starts recent recent_at", read and written once.
-- Returns {the jobs, in claim order, the jobs it could not read}.
gather = true
local q, limit = ARGV[1], tonumber(ARGV[2])
local now_n, now_s = clock(ARGV[6])
local group = v(ARGV[7] ~= '' and ARGV[7])
local expires = fmt(now_n + tonumber(ARGV[5]))
local settings = redis.call('HMGET', qk('fair', q), 'weights', 'default', 'clock',
                            'aging_every', 'aging_step', 'aging_cap')
if not settings[1] or redis.call('SISMEMBER', P .. 'paused', q) == 1 then
    return done({{}, unreadable})
end
local l = limits_of(q)
if l then limit = math.min(limit, room(q, l, '', nil, limit, now_n)) end
if limit <= 0 then return done({{}, unreadable}) end
local weights, default = cjson.decode(settings[1]), tonumber(settings[2])
local clock_at = tonumber(settings[3]) or 0
local aging_every, aging_step, aging_cap = tonumber(settings[4]), tonumber(settings[5]), tonumber(settings[6])

-- The priority a job claims with: its own, plus aging_step for every aging_every
-- seconds it has been due, up to aging_cap more (aging, when the queue has it).
local function aged(j)
    local p = tonumber(j.priority)
    if not aging_every then return p end
    local waited = math.max(now_n - tonumber(j.run_at), 0)
    return p + math.min(aging_cap, aging_step * math.floor(waited / aging_every))
end
promote(q, now_n)

-- The key job j takes turns by ('' for the shared key).
local function turn_of(j)
    return j.fair_key or j.limit_key or ''
end

local function weight_of(key)
    local w = key ~= '' and weights[key]
    return tonumber(w) or default
end

-- The head of the queue in claim order (its first :limit ready jobs, 20 at
-- least, 200 at most), by key: the jobs without a key are looked for there
-- alone, and a key's jobs there join its oldest ones (so that a key's job of a
-- higher priority is seen, not only its oldest).
local rooms, taken_group, unread, head = {}, {}, {}, {}
for _, m in ipairs(redis.call('ZRANGE', qk('ready', q), 0, math.min(math.max(limit, 20), 200) - 1)) do
    local j = load(tonumber(string.sub(m, 12)))
    if not j then
        unread[#unread + 1] = m
    elseif may_start(j, q, l, now_n, group, rooms, taken_group, limit) then
        local key = turn_of(j)
        head[key] = head[key] or {}
        table.insert(head[key], j)
    end
end

-- The keys with queued jobs, and where each one's turn stands.
local names, named = {}, {}
for _, set in ipairs({qk('kqkeys', q), qk('fqkeys', q)}) do
    for _, key in ipairs(redis.call('SMEMBERS', set)) do
        if not named[key] then names[#names + 1], named[key] = key, true end
    end
end
if head[''] then names[#names + 1] = '' end
if #names == 0 then return done({{}, unreadable}) end
local turns = {}
for i = 1, #names, 1000 do -- unpack takes a few thousand values at most
    local part = redis.call('HMGET', qk('fturn', q), unpack(names, i, math.min(i + 999, #names)))
    for _, t in ipairs(part) do turns[#turns + 1] = t end
end
local keys = {}
for i, key in ipairs(names) do
    local t = turns[i] and {string.match(turns[i], '^(%S+) (%S+) (%S+) (%S+)$')} or {}
    local pass = math.max(tonumber(t[1]) or clock_at, clock_at)
    local w = weight_of(key)
    keys[#keys + 1] = {key = key, w = w, pass = pass, next = pass + 1 / w,
                       starts = tonumber(t[2]) or 0, recent = tonumber(t[3]) or 0,
                       recent_at = tonumber(t[4]) or now_n, jobs = nil, taken = 0}
end
table.sort(keys, function(a, b)
    if a.next ~= b.next then return a.next < b.next end
    return a.key < b.key
end)

-- How many of its oldest jobs each key is read for: those whose tags could be
-- among the :limit smallest, were every key's line long enough (the turn T by
-- which :limit jobs would start, found by halving), and one more.
local function starting_by(t)
    local n = 0
    for _, k in ipairs(keys) do
        if k.next > t then break end -- no job of it, nor of those after, starts by t
        n = n + math.floor((t - k.pass) * k.w)
    end
    return n
end
local low, high = keys[1].pass, keys[1].pass + limit / keys[1].w
for _ = 1, 30 do
    local mid = (low + high) / 2
    if starting_by(mid) >= limit then high = mid else low = mid end
end
for _, k in ipairs(keys) do
    k.want = math.min(limit, math.max(1, math.ceil((high - k.pass) * k.w) + 1))
end

-- A key's claimable jobs (at most :limit), highest priority first, then oldest.
local function open(k)
    local found, seen = {}, {}
    for _, j in ipairs(head[k.key] or {}) do
        found[#found + 1] = j
        seen[j.id] = true
    end
    -- Each line's oldest jobs that take turns by the key (k.want of each).
    for _, line in ipairs(k.key ~= '' and {kk('kq', q, k.key), kk('fq', q, k.key)} or {}) do
        local start, chunk, more = 0, k.want, 0
        while more < k.want do
            local ids = redis.call('ZRANGE', line, start, start + chunk - 1)
            if #ids == 0 then break end
            start, chunk = start + chunk, math.min(chunk * 2, 1000)
            for _, id in ipairs(ids) do
                local j = not seen[id] and load(id)
                if j and j.state == 'queued' and turn_of(j) == k.key
                        and may_start(j, q, l, now_n, group, rooms, taken_group, limit) then
                    found[#found + 1] = j
                    seen[id] = true
                    more = more + 1
                    if more >= k.want then break end
                end
            end
        end
    end
    table.sort(found, function(a, b)
        local pa, pb = aged(a), aged(b)
        if pa ~= pb then return pa > pb end
        return tonumber(a.id) < tonumber(b.id)
    end)
    while #found > limit do table.remove(found) end
    k.jobs = found
end

-- Candidates: the keys met at the head first (their jobs may be of a higher
-- priority), then the others in rank order while a key's first tag is below the
-- :limit-th smallest tag seen.
local tagged, tags = {}, {}
local function add(k)
    open(k)
    k.opened = true
    for i, j in ipairs(k.jobs) do
        local tag = k.pass + i / k.w
        tagged[#tagged + 1] = {tag, aged(j), tonumber(j.id), j, k}
        tags[#tags + 1] = tag
    end
    table.sort(tags)
    while #tags > limit do table.remove(tags) end
end
for _, k in ipairs(keys) do
    if head[k.key] then add(k) end
end
for _, k in ipairs(keys) do
    if not k.opened then
        if #tags >= limit and k.next >= tags[limit] then break end
        add(k)
    end
end
-- Handed back in unreadable (common.lua), for the store to drop with job_drop.
for _, m in ipairs(unread) do
    local seen = {id = tostring(tonumber(string.sub(m, 12))), queue = q, state = 'queued', member = m}
    unreadable[#unreadable + 1] = cjson.encode(seen)
end
-- The highest priority first, then the smallest tags: claim order.
table.sort(tagged, function(a, b)
    if a[2] ~= b[2] then return a[2] > b[2] end
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[3] < b[3]
end)
while #tagged > limit do table.remove(tagged) end

local out, least = {}, nil
for _, c in ipairs(tagged) do
    local j, k = c[4], c[5]
    start_job(j, ARGV[3], ARGV[4], expires, now_s)
    k.taken = k.taken + 1
    if least == nil or k.pass < least then least = k.pass end
    if l and (l.rate or l.key_rate) then record_start(q, j, now_s) end
    out[#out + 1] = reply_of(j)
end
if l then prune_starts(q, l, now_n, tonumber(ARGV[8])) end

-- The turns move on: each key by its starts / its weight; the clock to the least
-- turn this claim started from.
if #out > 0 then
    local set = {}
    for _, k in ipairs(keys) do
        if k.taken > 0 then
            local recent = k.recent * math.exp(-math.max(now_n - k.recent_at, 0) / 60) + k.taken
            set[#set + 1] = k.key
            set[#set + 1] = string.format('%.17g %d %.17g %s', k.pass + k.taken / k.w,
                                          k.starts + k.taken, recent, now_s)
        end
    end
    redis.call('HSET', qk('fturn', q), unpack(set))
    if least > clock_at then redis.call('HSET', qk('fair', q), 'clock', string.format('%.17g', least)) end
end
return done({out, unreadable})

-- name: task_metrics_fold
-- ARGV: limit, bounds (the histograms' upper bounds, seconds, joined by commas),
-- a JSON object of the seconds each span's hashes are kept. Folds up to limit
-- events of the stream after tm:folded (from the stream's start when never
-- folded) into hashes tm:<span>:<start> (each span of metrics_protocol.SPANS,
-- listed in tm:starts:<span>, expiring when no longer read; tm:0:0, the totals,
-- kept), each sample for its task, every task of its queue (task '') and
-- everything (queue ''). A field is "n" or "s" (count, sum of seconds) and the
-- JSON array [queue, task, series, bucket]: names are data inside JSON, never
-- part of a key. Samples as metrics.sql's fold takes them: each counted kind; run
-- time of attempts that ended succeeded, failed or retried; wait (due to start)
-- of the attempt that is its job's newest and started after the job's run_at.
-- Returns how many events were read.
local limit = tonumber(ARGV[1])
local bounds = {}
for b in string.gmatch(ARGV[2], '[^,]+') do bounds[#bounds + 1] = tonumber(b) end
local keep = {}
for span, seconds in pairs(cjson.decode(ARGV[3])) do keep[tonumber(span)] = seconds end
local SPANS = {60, 600, 3600, 21600, 86400, 0}
local COUNTED = {
    enqueued = true, succeeded = true, failed = true, cancelled = true, retried = true,
    rescued = true, manual_retry = true,
}
local RAN = {succeeded = true, failed = true, retried = true}
local ENDED = {succeeded = true, failed = true, cancelled = true, retried = true}

local function bucket(seconds)
    for i, le in ipairs(bounds) do
        if seconds <= le then return i - 1 end
    end
    return #bounds
end

-- (key, field) -> {count, seconds}, written once at the end.
local adds, order = {}, {}
local function add(at, queue, task, series, b, seconds)
    local t = math.floor(at)
    local fields = {
        cjson.encode({queue, task, series, b}),
        cjson.encode({queue, '', series, b}),
        cjson.encode({'', '', series, b}),
    }
    for _, span in ipairs(SPANS) do
        local start = span == 0 and 0 or t - t % span
        local key = P .. 'tm:' .. span .. ':' .. start
        for _, field in ipairs(fields) do
            local id = key .. '\n' .. field
            local a = adds[id]
            if not a then
                a = {key, field, 0, 0, span, start}
                adds[id] = a
                order[#order + 1] = a
            end
            a[3] = a[3] + 1
            a[4] = a[4] + seconds
        end
    end
end

local folded_key = P .. 'tm:folded'
local after = redis.call('GET', folded_key)
local entries
if after then
    entries = redis.call('XRANGE', P .. 'events', '(' .. after .. '-0', '+', 'COUNT', limit)
else
    entries = redis.call('XRANGE', P .. 'events', '-', '+', 'COUNT', limit)
end
for _, entry in ipairs(entries) do
    local f = entry[2]
    local e = nil
    for i = 1, #f, 2 do
        if f[i] == 'e' then e = cjson.decode(f[i + 1]) end
    end
    -- Entries of the first layout (named fields) predate the metrics: passed over.
    if e then
        local job_id, queue, task, kind = e[1], e[2], e[3], e[4]
        local attempt, at = tonumber(e[5]), tonumber(e[6])
        local started = v(e[9]) and tonumber(e[9]) or nil
        if COUNTED[kind] then add(at, queue, task, kind, 0, 0) end
        if started and RAN[kind] and started <= at then
            local run = at - started
            add(at, queue, task, 'run', bucket(run), run)
        end
        if started and ENDED[kind] then
            local j = redis.call('HMGET', jkey(job_id), 'run_at', 'attempts')
            local run_at, attempts = tonumber(j[1]), tonumber(j[2])
            if run_at and attempts == attempt and run_at <= started then
                add(at, queue, task, 'wait', bucket(started - run_at), started - run_at)
            end
        end
    end
end
for _, a in ipairs(order) do
    redis.call('HINCRBY', a[1], 'n' .. a[2], a[3])
    if a[4] ~= 0 then redis.call('HINCRBYFLOAT', a[1], 's' .. a[2], fmt(a[4])) end
    local ttl = keep[a[5]]
    if ttl then
        -- Listed by start in tm:starts:<span> (what a read walks; prune trims it),
        -- and expires once older than it is kept (metrics_protocol.KEPT).
        redis.call('ZADD', P .. 'tm:starts:' .. a[5], a[6], a[6])
        redis.call('EXPIREAT', a[1], a[6] + a[5] + ttl)
    end
end
if #entries > 0 then
    redis.call('SET', folded_key, string.match(entries[#entries][1], '^(%d+)'))
end
return #entries

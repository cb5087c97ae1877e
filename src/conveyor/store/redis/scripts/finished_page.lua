-- name: finished_page
-- ARGV: low, high (bounds of finished_at, as ZRANGEBYSCORE takes them), skip
-- (entries of score low already read), count (the most entries read), mode, and
-- the mode's arguments. Reads one page of finished (terminal jobs by
-- finished_at), oldest first, and of each job only the fields the mode needs;
-- writes nothing. The callers (store/redis/history.py) walk page after page, so
-- a read of a million finished jobs holds the server a page at a time.
--   'slots' since, width: {queue, state, slot, count, ...}, jobs per minute of
--     the dashboard's chart (slot = whole widths since `since`).
--   'runs' bounds (JSON): {queue, bucket, count, seconds, ...}, run times of
--     succeeded and failed jobs (bucket = how many bounds lie below).
--   'purge' states (JSON), queue ('' = any), want, by_policy ('1': a queue's age
--     rule, which passes over a job whose own retain= names its state): {id, ...}
--     of the jobs in those states (of that queue), at most want; the page ends at
--     the entry that makes want.
-- Returns {read, last score, entries of that score read, of those the ones passed
-- over (not chosen, not gone), ids whose hash is gone, result}.
local rows = redis.call('ZRANGEBYSCORE', P .. 'finished', ARGV[1], ARGV[2], 'WITHSCORES',
                        'LIMIT', tonumber(ARGV[3]), tonumber(ARGV[4]))
local mode = ARGV[5]
local gone, out, agg, order = {}, {}, {}, {}
local read, last, tied, passed = 0, nil, 0, 0

local function add(key, fields, count, seconds)
    local a = agg[key]
    if not a then
        a = {fields, 0, 0}
        agg[key] = a
        order[#order + 1] = key
    end
    a[2] = a[2] + count
    a[3] = a[3] + seconds
end

local since, width, bounds, wanted, queue, want, by_policy
if mode == 'slots' then
    since, width = tonumber(ARGV[6]), tonumber(ARGV[7])
elseif mode == 'runs' then
    bounds = cjson.decode(ARGV[6])
else
    wanted = {}
    for _, s in ipairs(cjson.decode(ARGV[6])) do wanted[s] = true end
    queue, want = ARGV[7], tonumber(ARGV[8])
    by_policy = ARGV[9] == '1'
end

for i = 1, #rows, 2 do
    local id, score = rows[i], rows[i + 1]
    read = read + 1
    if score ~= last then last, tied, passed = score, 0, 0 end
    tied = tied + 1
    local f = redis.call('HMGET', jkey(id), 'queue', 'state', 'started_at', 'retain')
    local q, state = f[1], f[2]
    if not q or not state then
        gone[#gone + 1] = id -- dropped by the caller: it leaves finished
    elseif mode == 'slots' then
        local slot = math.floor((tonumber(score) - since) / width)
        add(q .. '\n' .. state .. '\n' .. slot, {q, state, slot}, 1, 0)
    elseif mode == 'runs' then
        if (state == 'succeeded' or state == 'failed') and f[3] then
            -- Six decimals, as the jobs' own datetimes have.
            local seconds = math.floor((tonumber(score) - tonumber(f[3])) * 1e6 + 0.5) / 1e6
            local bucket = 0
            for _, b in ipairs(bounds) do
                if b < seconds then bucket = bucket + 1 end
            end
            add(q .. '\n' .. bucket, {q, bucket}, 1, seconds)
        end
    elseif wanted[state] and (queue == '' or queue == q)
            and not (by_policy and f[4] and cjson.decode(f[4])[state]) then
        out[#out + 1] = id
        if #out >= want then break end
    else
        passed = passed + 1
    end
end

if mode ~= 'purge' then
    for _, key in ipairs(order) do
        local a = agg[key]
        for _, x in ipairs(a[1]) do out[#out + 1] = tostring(x) end
        out[#out + 1] = tostring(a[2])
        if mode == 'runs' then out[#out + 1] = fmt(a[3]) end
    end
end
return {read, last or '', tied, passed, gone, out}

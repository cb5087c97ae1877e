-- name: job_sweep_lost
-- uses upkeep.lua
-- ARGV: keys (how many keys this slice walks: SCAN's COUNT).
-- The sweep: a drop that does not know a job's group, batch or idempotency key
-- leaves its id in group:, gq:, batch: (and its count in bcount:) and key:.
-- The ids dropped so far (lost) are taken out of those as one lot
-- (lost:sweeping) by a SCAN of every sorted set, a slice a call; ids dropped
-- during a walk wait for the next one (a key that holds them existed before
-- they were dropped, so a whole walk meets it). A group whose head was one of
-- them goes on with its next job. Returns 1 while there is more to walk.
local lot, cursor_key = P .. 'lost:sweeping', P .. 'lost:cursor'
local SWEPT = {gq = true, group = true, batch = true, key = true}

-- The ids of the lot that an index (a sorted set of ids) holds: the smaller side is read.
local function lost_in(index, lost, count)
    local out = {}
    if redis.call('ZCARD', index) <= count then
        for _, id in ipairs(redis.call('ZRANGE', index, 0, -1)) do
            if lost[id] then out[#out + 1] = id end
        end
    else
        for id in pairs(lost) do
            if redis.call('ZSCORE', index, id) then out[#out + 1] = id end
        end
    end
    return out
end

local function sweep(keys)
    local cursor = redis.call('GET', cursor_key)
    if not cursor then
        if redis.call('EXISTS', P .. 'lost') == 0 then return 0 end
        redis.call('RENAME', P .. 'lost', lot)
        cursor = '0'
    end
    local lost, count = {}, 0
    local flat = redis.call('HGETALL', lot)
    for i = 1, #flat, 2 do
        lost[flat[i]] = flat[i + 1]
        count = count + 1
    end
    local pattern = string.gsub(P, '([%*%?%[%]\\])', '\\%1') .. '*'
    local reply = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', keys, 'TYPE', 'zset')
    for _, index in ipairs(reply[2]) do
        local kind, name = string.match(string.sub(index, #P + 1), '^(%a+):(.*)$')
        local ids = SWEPT[kind] and lost_in(index, lost, count) or {}
        if #ids > 0 then
            local head = kind == 'gq' and group_head(name)
            redis.call('ZREM', index, unpack(ids))
            for _, id in ipairs(ids) do
                if kind == 'batch' then decr(P .. 'bcount:' .. name, lost[id]) end
            end
            if head and lost[head] then -- the group goes on with its next job
                promote_head(name)
                wake_group({group_key = name})
            end
        end
    end
    if reply[1] == '0' then
        redis.call('DEL', lot, cursor_key)
        return redis.call('EXISTS', P .. 'lost')
    end
    redis.call('SET', cursor_key, reply[1])
    return 1
end

return done(sweep(tonumber(ARGV[1])))

-- name: job_forget_dropped
-- uses upkeep.lua
-- ARGV: dropped_before, limit. The histories of up to :limit jobs dropped
-- before the time (see upkeep.lua), oldest first: their events leave the
-- stream, their record goes. Returns how many.
local ids = redis.call('ZRANGEBYSCORE', P .. 'dropped:at', '-inf', '(' .. ARGV[1], 'LIMIT', 0,
                       tonumber(ARGV[2]))
for _, id in ipairs(ids) do
    delete_events(redis.call('HGET', P .. 'dropped', id))
    redis.call('HDEL', P .. 'dropped', id)
    redis.call('ZREM', P .. 'dropped:at', id)
end
return #ids

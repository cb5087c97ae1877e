-- name: sets_repair
-- ARGV: which ('retaining' or 'parked'), then job ids.
-- Rebuilds two sets that only mirror what each job's own keys say, for the ids
-- given (the store's repair walks every job that could belong, a slice a call):
-- retaining, a finished job whose own rule (retain) names the state it ended
-- in, scored by the moment it is due to go (as common.lua's enter puts it);
-- parked, a job with a wait mark (wait:<id>, as sleep_mark.lua and
-- signal_wait.lua put it). An id that does not belong is taken out. Returns how
-- many ids are in the set after the call.
local which = ARGV[1]
local set = P .. which
for i = 2, #ARGV do
    local id = ARGV[i]
    if which == 'retaining' then
        local f = redis.call('HMGET', jkey(id), 'state', 'finished_at', 'retain')
        local keep = f[3] and terminal(f[1]) and f[2] and cjson.decode(f[3])[f[1]]
        if keep then
            redis.call('ZADD', set, tonumber(f[2]) + keep, id)
        else
            redis.call('ZREM', set, id)
        end
    elseif redis.call('EXISTS', P .. 'wait:' .. id) == 1 and redis.call('EXISTS', jkey(id)) == 1 then
        redis.call('SADD', set, id)
    else
        redis.call('SREM', set, id)
    end
end
if which == 'retaining' then return redis.call('ZCARD', set) end
return redis.call('SCARD', set)

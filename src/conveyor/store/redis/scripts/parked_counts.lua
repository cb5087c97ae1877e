-- name: parked_counts
-- ARGV: now.
-- Per queue, the jobs parked by a wait (listed in parked, with wait:<id>):
-- queued for the wait's end and not due yet (a signal or an operator that made
-- one due has woken it). Reads only. Returns {queue, count, queue, count...}.
local now_n = tonumber(ARGV[1])
local counts, order = {}, {}
for _, id in ipairs(redis.call('SMEMBERS', P .. 'parked')) do
    local f = redis.call('HMGET', jkey(id), 'state', 'queue', 'run_at')
    if f[1] == 'queued' and tonumber(f[3]) > now_n
            and redis.call('EXISTS', P .. 'wait:' .. id) == 1 then
        if not counts[f[2]] then
            counts[f[2]] = 0
            order[#order + 1] = f[2]
        end
        counts[f[2]] = counts[f[2]] + 1
    end
end
local flat = {}
for _, q in ipairs(order) do
    flat[#flat + 1] = q
    flat[#flat + 1] = counts[q]
end
return flat

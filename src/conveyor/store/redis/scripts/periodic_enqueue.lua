-- name: periodic_enqueue
-- uses upkeep.lua
-- ARGV: name, tick, now, job (JSON, as job_insert_many's). Records :tick as the
-- last enqueued tick of the periodic task and enqueues its job, unless that
-- tick (or a later one) already was. Returns 1 when this call took the tick.
local now_n, now_s = clock(ARGV[3])
local last = tonumber(redis.call('HGET', P .. 'periodic', ARGV[1]))
if last and last >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', P .. 'periodic', ARGV[1], ARGV[2])
local n = cjson.decode(ARGV[4])
local found = nil
if v(n[8]) then found = find_key(n[1], n[8], n[9]) end
if not found then insert(n, now_s) end
return done(1)

-- name: wait_wake
-- ARGV: now, job id.
-- An operator wakes a parked job early: when it is queued, not due yet, with a
-- wait (wait:<id>) that ends later, the wait ends now (a sleep is over, a signal's
-- wait times out, a wait for children looks again) and the job is due now.
-- Returns 1 when it woke the job, else 0.
local now_n, now_s = clock(ARGV[1])
local j = load(ARGV[2])
if not j or j.state ~= 'queued' or tonumber(j.run_at) <= now_n then return done(0) end
local wait = P .. 'wait:' .. j.id
local until_s = redis.call('HGET', wait, 'until')
if not until_s or tonumber(until_s) <= now_n then return done(0) end
redis.call('HSET', wait, 'until', now_s)
move(j, 'queued', 'run_at', now_s)
publish('jobs', j.queue)
return done(1)

-- name: signal_send
-- ARGV: now, job id, signal name, payload (JSON text).
-- Keeps a signal for a live job in its list signals:<id> (JSON [name, payload,
-- sent_at, received_at, step], deleted with the job), and makes the job due now
-- when it is parked waiting for a signal of that name (wait:<id>). A finished
-- or unknown job keeps nothing. Returns {state or false, kept, woken}.
local now_n, now_s = clock(ARGV[1])
local j = load(ARGV[2])
if not j then return {false, 0, 0} end
if not live(j.state) then return {j.state, 0, 0} end
redis.call('RPUSH', P .. 'signals:' .. j.id, cjson.encode({ARGV[3], ARGV[4], now_s, false, false}))
local woken = 0
if j.state == 'queued' and tonumber(j.run_at) > now_n
        and redis.call('HGET', P .. 'wait:' .. j.id, 'signal') == ARGV[3] then
    move(j, 'queued', 'run_at', now_s)
    publish('jobs', j.queue)
    woken = 1
end
return done({j.state, 1, woken})

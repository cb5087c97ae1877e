-- name: limit_key_usage
-- ARGV: queue, limit key, now. One key of a queue (conveyor/store/limit_keys.py):
-- {running jobs (krun), starts in the key rate's window (none counted without a
-- key rate), the throttle's end while it lasts (false: none)}.
local q, key, now = ARGV[1], ARGV[2], clock(ARGV[3])
local l = limits_of(q) or {}
local running = tonumber(redis.call('HGET', qk('krun', q), key)) or 0
local started = l.key_rate and started_since(kk('kstarts', q, key), now - l.key_per) or 0
local until_ = redis.call('HGET', qk('kthrottle', q), key)
if not (until_ and tonumber(until_) > now) then until_ = false end
return {running, started, until_}

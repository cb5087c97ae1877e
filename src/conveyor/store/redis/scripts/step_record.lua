-- name: step_record
-- ARGV: id, token, name, step (JSON [result, attempt, started_at, finished_at];
-- finished_at '' = Redis's clock).
-- Records a durable step of a running job under its lease, in the job's steps
-- hash (steps:<id>, deleted with the job). A step of that name recorded already
-- is kept. Returns the step as recorded, or nil when the lease no longer holds
-- and no step of that name was recorded.
local steps = P .. 'steps:' .. ARGV[1]
local f = redis.call('HMGET', jkey(ARGV[1]), 'state', 'lease_token', 'attempts')
if f[1] == 'running' and f[2] == ARGV[2] and redis.call('HEXISTS', steps, ARGV[3]) == 0 then
    local step = cjson.decode(ARGV[4])
    step[2] = f[3]
    if step[4] == '' then
        local _, now_s = clock('')
        step[4] = now_s
    end
    local encoded = cjson.encode(step)
    redis.call('HSET', steps, ARGV[3], encoded)
    return encoded
end
return redis.call('HGET', steps, ARGV[3])

-- name: job_progress
-- ARGV: id, token, fraction ('' = keep), message ('' with ARGV[5] = '0': none).
-- Returns 1 when the lease still holds and the progress was written.
local f = redis.call('HMGET', jkey(ARGV[1]), 'state', 'lease_token')
if f[1] ~= 'running' or f[2] ~= ARGV[2] then return 0 end
if ARGV[3] ~= '' then redis.call('HSET', jkey(ARGV[1]), 'progress', ARGV[3]) end
if ARGV[5] == '1' then
    redis.call('HSET', jkey(ARGV[1]), 'progress_message', ARGV[4])
else
    redis.call('HDEL', jkey(ARGV[1]), 'progress_message')
end
return 1

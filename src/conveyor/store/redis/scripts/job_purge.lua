-- name: job_purge
-- ARGV: finished_before, limit. Deletes up to :limit terminal jobs finished
-- before the time, oldest first, with their events.
local ids = redis.call('ZRANGEBYSCORE', P .. 'finished', '-inf', '(' .. ARGV[1], 'LIMIT', 0,
                       tonumber(ARGV[2]))
for _, id in ipairs(ids) do delete(load(id)) end
return done(#ids)

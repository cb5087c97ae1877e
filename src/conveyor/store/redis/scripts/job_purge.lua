-- name: job_purge
-- uses upkeep.lua
-- ARGV: finished_before, limit. Deletes up to :limit terminal jobs finished
-- before the time, oldest first, with their events (one that cannot be read is
-- dropped: see upkeep.lua). Returns how many were deleted.
local ids = redis.call('ZRANGEBYSCORE', P .. 'finished', '-inf', '(' .. ARGV[1], 'LIMIT', 0,
                       tonumber(ARGV[2]))
local deleted = 0
for _, id in ipairs(ids) do
    local j = load(id)
    if j and flow_needed(j) then -- a parent of jobs yet to run stays (flows.lua)
    elseif j then
        delete(j)
        deleted = deleted + 1
    else
        drop(id, {state = 'finished'})
    end
end
return done(deleted)

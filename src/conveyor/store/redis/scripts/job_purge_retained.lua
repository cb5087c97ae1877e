-- name: job_purge_retained
-- uses upkeep.lua
-- ARGV: now, limit.
-- Deletes up to :limit finished jobs whose own retention (retain=) for the state
-- they ended in has run out at now, from the "retaining" index (by the moment
-- each is due to go: enter and leave in common.lua keep it, so a job retried
-- meanwhile is no longer in it). A parent of jobs yet to run stays (flows.lua),
-- as the purges keep it. Returns the ids deleted.
local due = redis.call('ZRANGEBYSCORE', P .. 'retaining', '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local deleted = {}
for _, id in ipairs(due) do
    local j = load(id)
    if not j or not terminal(j.state) then
        zrem(P .. 'retaining', id) -- gone, or no longer finished: an entry left behind
    elseif not flow_needed(j) then
        delete(j)
        deleted[#deleted + 1] = tonumber(j.id)
    end
end
return done(deleted)

-- name: job_drop
-- uses upkeep.lua
-- ARGV: now ('' = Redis's clock), jobs (JSON [{id, queue, state, member, group,
-- key}, ...]: where each was met, as far as known; state 'finished': one of the
-- terminal states).
-- Jobs met in an index that could not be read: by a read from Python, or by a
-- script that hands them back (see drop in common.lua). Each is dropped (see
-- upkeep.lua) unless it can be read by now. Returns the ids dropped.
clock(ARGV[1])
local dropped = {}
for _, seen in ipairs(cjson.decode(ARGV[2])) do
    if drop(seen.id, seen) then dropped[#dropped + 1] = tonumber(seen.id) end
end
return done(dropped)

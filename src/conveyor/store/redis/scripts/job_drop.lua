-- name: job_drop
-- ARGV: now ('' = Redis's clock), jobs (JSON [[id, queue, state], ...], queue
-- and state null when unknown; state 'finished': one of the terminal states).
-- Jobs that a read from Python met in an index but could not read: each is
-- dropped (see drop in common.lua) unless it can be read by now. Returns the
-- ids dropped.
clock(ARGV[1])
local dropped = {}
for _, item in ipairs(cjson.decode(ARGV[2])) do
    if drop(item[1], {queue = v(item[2]), state = v(item[3])}) then
        dropped[#dropped + 1] = tonumber(item[1])
    end
end
return done(dropped)

-- name: job_delete
-- uses upkeep.lua
-- ARGV: ids (JSON), finished_before ('' = any job that is not running; else
-- only terminal jobs finished before it), states (JSON list or null), queue ('' = any).
-- Deletes jobs with their events (the stream entries too). Returns the ids deleted.
local before, states = tonumber(ARGV[2]), v(cjson.decode(ARGV[3]))
local allowed = states and {}
for _, s in ipairs(states or {}) do allowed[s] = true end
local deleted = {}
local now_s = nil
for _, id in ipairs(cjson.decode(ARGV[1])) do
    local j = load(id)
    local ok = j and (before and terminal(j.state) and tonumber(j.finished_at) < before
                      -- a parent of jobs yet to run stays (flows.lua)
                      and not flow_needed(j)
                      or not before and j.state ~= 'running')
    if ok and (not allowed or allowed[j.state]) and (ARGV[4] == '' or j.queue == ARGV[4]) then
        if not terminal(j.state) then -- the jobs waiting for it go on (flows.lua)
            now_s = now_s or select(2, clock(''))
            flow_orphan(j, now_s)
        end
        delete(j)
        deleted[#deleted + 1] = tonumber(j.id)
    end
end
return done(deleted)

-- name: job_delete
-- uses upkeep.lua
-- ARGV: ids (JSON), finished_before ('' = any job that is not running; else
-- only terminal jobs finished before it), states (JSON list or null), queue ('' = any).
-- Deletes jobs with their events (the stream entries too). Returns the ids deleted.
local before = tonumber(ARGV[2])
local states = v(cjson.decode(ARGV[3]))
local allowed = nil
if states then
    allowed = {}
    for _, s in ipairs(states) do allowed[s] = true end
end
local deleted = {}
local now_s = nil
for _, id in ipairs(cjson.decode(ARGV[1])) do
    local j = load(id)
    local ok = j ~= nil
    if ok and before then
        ok = terminal(j.state) and tonumber(j.finished_at) < before
        ok = ok and not flow_needed(j) -- a parent of jobs yet to run stays (flows.lua)
    elseif ok then
        ok = j.state ~= 'running'
    end
    if ok and allowed then ok = allowed[j.state] == true end
    if ok and ARGV[4] ~= '' then ok = j.queue == ARGV[4] end
    if ok then
        if j.state ~= 'running' then -- the jobs waiting for it (flows.lua)
            now_s = now_s or select(2, clock(''))
            flow_orphan(j, now_s)
        end
        delete(j)
        deleted[#deleted + 1] = tonumber(j.id)
    end
end
return done(deleted)

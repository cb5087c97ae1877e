-- name: workflow_retry
-- uses upkeep.lua
-- ARGV: workflow id, now. Runs a workflow again from its failures (the rule is
-- conveyor/store/workflow_retry.py's): its failed jobs, and the cancelled jobs
-- their failure reached (children through edges that resolved failed or
-- cancelled, and theirs in turn), go back as new; one whose parent runs again
-- waits for it (those edges resolve again), the others are queued. Returns the
-- ids put back, or false, changing nothing, when one of them has a key that
-- another live job holds now.
local workflow = ARGV[1]
local now_n, now_s = clock(ARGV[2])
local redo, chosen = {}, {}
local function take(j)
    if not redo[j.id] then
        redo[j.id] = true
        chosen[#chosen + 1] = j
    end
end
for _, id in ipairs(flow_workflow_ids(workflow) or {}) do
    local j = load(id)
    if j and j.state == 'failed' then take(j) end
end
local i = 1
while i <= #chosen do -- breadth first: each job's cancelled children, once
    local pid = chosen[i].id
    i = i + 1
    for _, cid in ipairs(redis.call('ZRANGE', wkey('wc', pid), 0, -1)) do
        local resolved = redis.call('HGET', wkey('wp', cid), pid)
        if resolved == 'failed' or resolved == 'cancelled' then
            local c = load(cid)
            if c and c.state == 'cancelled' then take(c) end
        end
    end
end
for _, j in ipairs(chosen) do -- a key that another live job holds: nothing changes
    if j.key then
        for _, other in ipairs(redis.call('ZRANGE', kk('key', j.queue, j.key), 0, -1)) do
            if other ~= j.id and live(job_fields(other, 'state')[1]) then return false end
        end
    end
end
table.sort(chosen, function(a, b) return tonumber(a.id) < tonumber(b.id) end)
local changed = {}
for _, j in ipairs(chosen) do
    local pending = 0
    for _, p in ipairs(redis.call('HKEYS', wkey('wp', j.id))) do
        if redo[p] then
            redis.call('HSET', wkey('wp', j.id), p, '')
            pending = pending + 1
        end
    end
    requeue_manually(j, now_s)
    j.pending = tostring(pending)
    save(j, {'pending'})
    if pending > 0 then move(j, 'waiting') end
    event(j, 'manual_retry', 0, now_s, nil)
    changed[#changed + 1] = tonumber(j.id)
end
return done(changed)

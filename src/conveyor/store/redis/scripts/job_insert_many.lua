-- name: job_insert_many
-- ARGV: now, jobs (JSON [[queue, task, args, kwargs, priority, run_at,
-- max_attempts, key, unique, group, batch, limit_key], ...]).
-- A job with a key that a live job of its queue holds (or, unique "forever",
-- any job not yet purged) is not inserted: that job answers in its place.
-- Returns, per job in order: {0, id} inserted now, or {1, id, fields...} an
-- existing job.
local now_n, now_s = clock(ARGV[1])
local out, mine = {}, {}
for _, n in ipairs(cjson.decode(ARGV[2])) do
    local found = nil
    if v(n[8]) then found = find_key(n[1], n[8], n[9]) end
    if found and mine[found] then
        out[#out + 1] = {0, tonumber(found)}
    elseif found then
        local answer = {1, tonumber(found)}
        for _, x in ipairs(flat(load(found))) do answer[#answer + 1] = x end
        out[#out + 1] = answer
    else
        local j = insert(n, now_s)
        mine[j.id] = true
        out[#out + 1] = {0, tonumber(j.id)}
    end
end
return out

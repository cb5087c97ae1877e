-- name: job_insert_many
-- ARGV: now, jobs (JSON [[queue, task, args, kwargs, priority, run_at,
-- max_attempts, key, unique, group, batch, limit_key, headers], ...]).
-- A job with a key that a live job of its queue holds (or, unique "forever",
-- any job not yet purged) is not inserted: that job answers in its place, and
-- so does the first job of the batch with the same key. Returns, per job in
-- order: {0, id} inserted now, or {1, id, fields...} an existing job; and the
-- jobs it could not read (unreadable).
local now_n, now_s = clock(ARGV[1])
local jobs = cjson.decode(ARGV[2])
-- First what becomes of each job, then one range of ids for those inserted.
local plan, first_of_key, count = {}, {}, 0
for position, n in ipairs(jobs) do
    local key = v(n[8])
    local pair = key and (nm(n[1]) .. ':' .. key)
    if pair and first_of_key[pair] then
        plan[position] = {'same', first_of_key[pair]}
    else
        local found = key and find_key(n[1], key, n[9])
        if found then
            plan[position] = {'old', found}
            if pair then first_of_key[pair] = position end
        else
            count = count + 1
            plan[position] = {'new'}
            if pair then first_of_key[pair] = position end
        end
    end
end
local next_id = redis.call('INCRBY', P .. 'ids', count) - count
local out = {}
for position, n in ipairs(jobs) do
    local what = plan[position]
    if what[1] == 'new' then
        next_id = next_id + 1
        insert(n, now_s, tostring(next_id))
        out[position] = {0, next_id}
    elseif what[1] == 'same' then
        out[position] = out[what[2]]
    else
        local answer = {1, tonumber(what[2])}
        for _, x in ipairs(flat(load(what[2]))) do answer[#answer + 1] = x end
        out[position] = answer
    end
end
return done({out, unreadable})

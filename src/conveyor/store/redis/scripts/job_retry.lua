-- name: job_retry
-- uses upkeep.lua
-- ARGV: now, ids (JSON, ascending), newest ('1': a keyed job only when it is
-- the newest of its key), failed_before ('' = any time; else failed jobs only,
-- finished at or before it).
-- Queues failed or cancelled jobs again, attempts reset, unless another live
-- job now holds the key. Returns the ids queued.
local now_n, now_s = clock(ARGV[1])
local before, changed = tonumber(ARGV[4]), {}
for _, id in ipairs(cjson.decode(ARGV[2])) do
    local j = load(id)
    local ok = j and (j.state == 'failed' or (j.state == 'cancelled' and not before))
        and (not before or tonumber(j.finished_at) <= before)
    -- A keyed job: unless another live job now holds its key (and, asked, the newest).
    local holders = ok and j.key and redis.call('ZREVRANGE', kk('key', j.queue, j.key), 0, -1) or {}
    if ARGV[3] == '1' and holders[1] and holders[1] ~= j.id then ok = false end
    for _, other in ipairs(holders) do
        if other ~= j.id and live(job_fields(other, 'state')[1]) then ok = false end
    end
    if ok then
        requeue_manually(j, now_s)
        event(j, 'manual_retry', 0, now_s, nil)
        changed[#changed + 1] = tonumber(j.id)
    end
end
return done(changed)

-- name: payload_rewrite
-- ARGV: groups of five: id, field (args, kwargs, result or step), old, new, step name.
-- Replaces each value only while it still holds `old` (see store/payloads.py):
-- a result recorded, or arguments replaced, since the page was read are kept.
-- A step's value is the first element of its JSON entry in steps:<id>.
-- Returns how many values were written.
local written = 0
for i = 1, #ARGV, 5 do
    local id, field, old, new, step = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
    if field == 'step' then
        local steps = P .. 'steps:' .. id
        local entry = redis.call('HGET', steps, step)
        if entry then
            local decoded = cjson.decode(entry)
            if decoded[1] == old then
                decoded[1] = new
                redis.call('HSET', steps, step, cjson.encode(decoded))
                written = written + 1
            end
        end
    elseif redis.call('HGET', jkey(id), field) == old then
        redis.call('HSET', jkey(id), field, new)
        written = written + 1
    end
end
return written

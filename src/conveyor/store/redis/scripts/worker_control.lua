-- name: worker_control
-- ARGV: id, changes (JSON). Merges the changes into what was asked of a registered
-- worker before (a key set to null drops it); returns the control, or false for a
-- worker that is not registered.
local key = P .. 'worker:' .. ARGV[1]
if redis.call('EXISTS', key) == 0 then return false end
local current = redis.call('HGET', key, 'control')
local control = {}
if current then control = cjson.decode(current) end
for name, value in pairs(cjson.decode(ARGV[2])) do
    if value == cjson.null then control[name] = nil else control[name] = value end
end
local text = '{}'
if next(control) ~= nil then text = cjson.encode(control) end
redis.call('HSET', key, 'control', text)
return text

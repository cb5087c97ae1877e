-- name: fair_any
-- ARGV: queues (JSON). The fair queues among them.
local fair = {}
for _, q in ipairs(cjson.decode(ARGV[1])) do
    if redis.call('SISMEMBER', P .. 'fairqs', q) == 1 then fair[#fair + 1] = q end
end
return fair

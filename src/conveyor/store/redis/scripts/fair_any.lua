-- name: fair_any
-- ARGV: queues (JSON). {the fair queues among them, 1 if any of them has limits}.
local fair, limited = {}, 0
for _, q in ipairs(cjson.decode(ARGV[1])) do
    if redis.call('SISMEMBER', P .. 'fairqs', q) == 1 then fair[#fair + 1] = q end
    if is_limited(q) then limited = 1 end
end
return {fair, limited}

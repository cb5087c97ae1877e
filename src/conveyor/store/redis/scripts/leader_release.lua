-- name: leader_release
-- ARGV: name, holder.
local key = P .. 'leader:' .. ARGV[1]
if redis.call('HGET', key, 'holder') == ARGV[2] then redis.call('DEL', key) end
return 1

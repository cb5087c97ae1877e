-- name: audit_list
-- ARGV: how many, and the id to read below ('' for the newest).
-- The list holds ids top, top-1, ... from its head (see audit_record).
local top = tonumber(redis.call('GET', P .. 'audit:seq') or '0')
local start = 0
if ARGV[2] ~= '' then
    start = math.max(top - tonumber(ARGV[2]) + 1, 0)
end
return redis.call('LRANGE', P .. 'audit', start, start + tonumber(ARGV[1]) - 1)

-- name: audit_record
-- ARGV: the entry as JSON without its id, the most entries kept.
-- The entry gets the next id and goes to the head of a capped list: the
-- oldest fall off the tail. Ids are contiguous along the list (each id is
-- given here, with its push), so audit_list finds an id's place by arithmetic.
local id = redis.call('INCR', P .. 'audit:seq')
local entry = cjson.decode(ARGV[1])
entry['id'] = id
redis.call('LPUSH', P .. 'audit', cjson.encode(entry))
redis.call('LTRIM', P .. 'audit', 0, tonumber(ARGV[2]) - 1)
return id

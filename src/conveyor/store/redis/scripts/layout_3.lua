-- name: layout_3
-- ARGV: ids of jobs with a wc: set (the migration finds them with SCAN).
-- From layout 2: a job that others wait for says so in its hash (children '1',
-- see flows.lua), so that the end of a job none waits for reads no wc: set.
for _, id in ipairs(ARGV) do
    if redis.call('EXISTS', P .. 'wc:' .. id) == 1 and redis.call('EXISTS', jkey(id)) == 1 then
        redis.call('HSET', jkey(id), 'children', '1')
    end
end
return #ARGV

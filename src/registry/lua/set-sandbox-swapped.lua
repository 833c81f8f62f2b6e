-- A paused sandbox's memory paged out (pause mode `swap`): what it still holds and what is
-- in swap, on its record. Only while it is paused on this node: a sandbox resumed, moved or
-- ended meanwhile keeps its record as it is.
-- KEYS[1] sandbox hash; ARGV[1] node, ARGV[2] swapped (JSON)
-- Returns 1, or 0 when the sandbox is not paused on that node.
local got = redis.call('HMGET', KEYS[1], 'state', 'node')
if got[1] ~= 'paused' or got[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'swapped', ARGV[2])
return 1

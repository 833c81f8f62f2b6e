-- A worker host offers a ready sandbox of a pool, only if the pool still has that version.
-- KEYS[1] the pool's definition (PoolRecord JSON), KEYS[2] the host's ready list of that version, KEYS[3] the pool's set of ready lists
-- ARGV[1] version, ARGV[2] sandbox id
-- Answers 1 when offered, 0 when the pool is gone or changed (the host then destroys it).
local raw = redis.call('GET', KEYS[1])
if not raw or cjson.decode(raw).version ~= ARGV[1] then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], KEYS[2])
return 1

-- A worker host offers a ready sandbox of a pool, only if the pool still has that version.
-- KEYS[1] the pools hash, KEYS[2] the host's ready list of that version
-- ARGV[1] pool name, ARGV[2] version, ARGV[3] sandbox id
-- Answers 1 when offered, 0 when the pool is gone or changed (the host then destroys it).
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
if cjson.decode(raw).version ~= ARGV[2] then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[3])
return 1

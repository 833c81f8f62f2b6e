-- Takes one ready sandbox of a pool on one worker host, or records a miss.
-- KEYS[1] the host's ready list of the pool's current version, KEYS[2] the pool's claim/miss events (zset)
-- ARGV[1] now (ms), ARGV[2] a unique event id, ARGV[3] '1' to record a miss when the list is empty
-- Answers the sandbox id, or false. Atomic: two gateways never take the same sandbox.
local id = redis.call('LPOP', KEYS[1])
local now = tonumber(ARGV[1])
if id then
  redis.call('ZADD', KEYS[2], now, 'c:' .. ARGV[2])
elseif ARGV[3] == '1' then
  redis.call('ZADD', KEYS[2], now, 'm:' .. ARGV[2])
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 60000)
return id

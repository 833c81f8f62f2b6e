-- A sandbox ended: a diverted create that fell back to the local pool stops counting as
-- pending diverted demand; one that failed counts as unmet demand for a while.
-- KEYS: burstFellBack, burstFellBackFailed ({burst})   ARGV: id, failed ('1'|'0')
local fellBackAtMs = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not fellBackAtMs then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == '1' then redis.call('ZADD', KEYS[2], fellBackAtMs, ARGV[1]) end
return 1

-- Write only while holding the lock. KEYS: lock, key  ARGV: holder, value
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[2], ARGV[2]) return 1 end
return 0

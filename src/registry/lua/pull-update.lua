-- KEYS: pulls, the name's lease, active pull names
-- ARGV: name, record JSON, owner token, lease ms, '1' when the pull ended ('0' while it runs), '1' to give the lease up
-- Writes the record and renews the lease only while the caller holds it. Returns 1, or 0 when it lost the lease.
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
if ARGV[5] == '1' then redis.call('SREM', KEYS[3], ARGV[1]) end
if ARGV[5] == '1' or ARGV[6] == '1' then redis.call('DEL', KEYS[2]) else redis.call('PEXPIRE', KEYS[2], ARGV[4]) end
return 1

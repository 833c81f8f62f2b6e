-- KEYS: layer record, layer set, names, owners   ARGV: digest.  Returns 1 if removed, 0 if a name points to it.
for _, d in ipairs(redis.call('HVALS', KEYS[3])) do if d == ARGV[1] then return 0 end end
redis.call('DEL', KEYS[1], KEYS[4])
redis.call('SREM', KEYS[2], ARGV[1])
return 1

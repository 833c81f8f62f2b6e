-- Counts sandboxes referring to layers up or down (a count that reaches 0 is removed:
-- layer garbage collection reads the hash's fields as the layers in use).
-- KEYS: layerRefs   ARGV: by (1 or -1), then digests
local by = tonumber(ARGV[1])
for i = 2, #ARGV do
  if ARGV[i] ~= '' and redis.call('HINCRBY', KEYS[1], ARGV[i], by) <= 0 then redis.call('HDEL', KEYS[1], ARGV[i]) end
end
return 1

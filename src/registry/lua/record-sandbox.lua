-- A new sandbox's record, once: a second writer of the same id (a retried create that
-- found its Idempotency-Key without a record) does nothing. Its layers are counted in
-- the layer references already (`layerRefs` 1: a terminal transition uncounts them).
-- KEYS: sandbox   ARGV: field/value pairs.  Returns 1 if written, 0 if it existed.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'layerRefs', '1', unpack(ARGV))
return 1

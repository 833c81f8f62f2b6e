-- KEYS: pulls (name -> ImagePull JSON), the name's lease, active pull names
-- ARGV: name, new record JSON (state pulling), owner token, lease ms, canonical ref, platform
-- Returns {outcome, record JSON}: 'started' (the new record, leased to the caller),
-- 'joined' (a pull of the same ref and platform runs with a live lease), 'resumable' (one
-- runs whose lease lapsed: now leased to the caller), 'conflict' (another ref is pulling into the name).
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local rec = cjson.decode(cur)
  if rec.state == 'pulling' then
    if rec.ref ~= ARGV[5] or rec.platform ~= ARGV[6] then return {'conflict', cur} end
    if redis.call('EXISTS', KEYS[2]) == 1 then return {'joined', cur} end
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
    return {'resumable', cur}
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('SADD', KEYS[3], ARGV[1])
return {'started', ARGV[2]}

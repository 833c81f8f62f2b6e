-- One page of a sandbox's command log (a sorted set: score = queuedAt ms, member =
-- sandboxId/commandId; Redis orders equal scores by member bytes), after a cursor, in one
-- step so a command abandoned meanwhile (ZREM) cannot shift the page.
-- KEYS: log   ARGV: afterScore ('' = from the start), afterMember, count
-- Returns up to `count` {member, score, member, score, ...} after the cursor's position.
local start = 0
if ARGV[1] ~= '' then
  local rank = redis.call('ZRANK', KEYS[1], ARGV[2])
  if rank then
    start = rank + 1
  else
    -- The cursor's command left the log (abandoned): resume after where it stood.
    local function before(a, b)
      for i = 1, math.min(#a, #b) do
        local x, y = a:byte(i), b:byte(i)
        if x ~= y then return x < y end
      end
      return #a < #b
    end
    start = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[1])
    for _, member in ipairs(redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[1], 'BYSCORE')) do
      if before(member, ARGV[2]) then start = start + 1 end
    end
  end
end
return redis.call('ZRANGE', KEYS[1], start, start + tonumber(ARGV[3]) - 1, 'WITHSCORES')

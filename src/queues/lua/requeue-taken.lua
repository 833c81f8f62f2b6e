-- Puts what a previous process of this host left in `taken` back at the consuming end.
local n = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do n = n + 1 end
return n

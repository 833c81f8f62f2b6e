-- A batch's task bookkeeping, one script so every change is atomic and shares `settle`.
-- KEYS[1] the batch hash, KEYS[2] its queue (list of customIds), KEYS[3] its leases (zset
-- customId -> lease end ms), KEYS[4] attempts (hash), KEYS[5] done (hash customId -> status),
-- KEYS[6] results (stream), KEYS[7] the set of active batches
-- ARGV[1] the operation, ARGV[2] the batch id, ARGV[3] now (ms), ARGV[4] now (ISO 8601), then the operation's own.
local batch, queue, leases, attempts, done, results, active = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local op, id, now, nowIso = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local function count(field)
  return tonumber(redis.call('HGET', batch, 'n:' .. field) or '0')
end

local function enter(state)
  redis.call('HSET', batch, 'state', state, 'ts:' .. state, nowIso)
end

-- Ends the batch once nothing is queued or running.
local function settle()
  if count('queued') > 0 or count('running') > 0 then return end
  local state = redis.call('HGET', batch, 'state')
  if state == 'in_progress' then
    enter('finalizing')
    enter('completed')
  elseif state == 'cancelling' then
    enter(redis.call('HGET', batch, 'endState') or 'cancelled')
  else
    return
  end
  redis.call('SREM', active, id)
end

-- A task's one terminal result; false when it already had one.
local function finish(task, status, line)
  if redis.call('HEXISTS', done, task) == 1 then return false end
  if redis.call('ZREM', leases, task) == 1 then
    redis.call('HINCRBY', batch, 'n:running', -1)
  elseif redis.call('LREM', queue, 0, task) > 0 then
    redis.call('HINCRBY', batch, 'n:queued', -1)
  end
  redis.call('HSET', done, task, status)
  redis.call('HINCRBY', batch, 'n:' .. status, 1)
  return redis.call('XADD', results, '*', 'r', line)
end

local function cancelledLine(task, reason)
  local n = tonumber(redis.call('HGET', attempts, task) or '0')
  return '{"customId":' .. cjson.encode(task) .. ',"status":"cancelled","steps":[],"attempts":' .. n ..
    ',"error":{"code":"cancelled","message":' .. cjson.encode(reason) .. '},"endedAt":' .. cjson.encode(nowIso) .. '}'
end

-- A task that stopped running here goes back to the head of the queue, or ends cancelled
-- when its batch is being cancelled.
local function backToQueue(task)
  if redis.call('HGET', batch, 'state') == 'cancelling' then
    finish(task, 'cancelled', cancelledLine(task, 'the batch was cancelled'))
  else
    redis.call('LPUSH', queue, task)
    redis.call('HINCRBY', batch, 'n:queued', 1)
  end
end

if op == 'start' then
  -- validating -> in_progress: its tasks may be claimed from now on. Answers 1, or 0 when it was not validating.
  if redis.call('HGET', batch, 'state') ~= 'validating' then return 0 end
  enter('in_progress')
  redis.call('SADD', active, id)
  return 1
elseif op == 'claim' then
  -- ARGV[5] lease end (ms). Answers {customId, attempt} or false.
  if redis.call('HGET', batch, 'state') ~= 'in_progress' then return false end
  if count('running') >= tonumber(redis.call('HGET', batch, 'maxConcurrency')) then return false end
  local task = redis.call('LPOP', queue)
  if not task then return false end
  redis.call('ZADD', leases, tonumber(ARGV[5]), task)
  redis.call('HINCRBY', batch, 'n:queued', -1)
  redis.call('HINCRBY', batch, 'n:running', 1)
  return {task, redis.call('HINCRBY', attempts, task, 1)}
elseif op == 'finish' then
  -- ARGV[5] customId, ARGV[6] status, ARGV[7] the result line (JSON). Answers its cursor or false.
  local cursor = finish(ARGV[5], ARGV[6], ARGV[7])
  settle()
  return cursor
elseif op == 'requeue' then
  -- ARGV[5] customId, ARGV[6] '1' to charge the attempt, '0' to give it back (backpressure).
  local task = ARGV[5]
  if redis.call('HEXISTS', done, task) == 1 then return false end
  if redis.call('ZREM', leases, task) == 0 then return false end
  redis.call('HINCRBY', batch, 'n:running', -1)
  if ARGV[6] == '0' then redis.call('HINCRBY', attempts, task, -1) end
  backToQueue(task)
  settle()
  return true
elseif op == 'renew' then
  -- ARGV[5] lease end (ms), ARGV[6..] customIds: leases of tasks still running here.
  for i = 6, #ARGV do redis.call('ZADD', leases, 'XX', tonumber(ARGV[5]), ARGV[i]) end
  return true
elseif op == 'reclaim' then
  -- Tasks whose runner stopped renewing (its gateway died): queued again, first, their attempt charged.
  local lapsed = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  for _, task in ipairs(lapsed) do
    redis.call('ZREM', leases, task)
    redis.call('HINCRBY', batch, 'n:running', -1)
    backToQueue(task)
  end
  settle()
  return #lapsed
elseif op == 'cancel' then
  -- ARGV[5] the state to end in (cancelled or expired), ARGV[6] why. Queued tasks end now,
  -- running ones when their runners see it. Answers the batch's state after.
  local state = redis.call('HGET', batch, 'state')
  if state ~= 'in_progress' and state ~= 'validating' then return state end
  enter('cancelling')
  redis.call('HSET', batch, 'endState', ARGV[5])
  -- The queued tasks end here, the queue goes whole: no per-task LREM, so cancelling a
  -- batch of 100,000 queued tasks is linear, not quadratic.
  local queued = redis.call('LRANGE', queue, 0, -1)
  redis.call('DEL', queue)
  redis.call('HSET', batch, 'n:queued', 0)
  for _, task in ipairs(queued) do
    if redis.call('HSETNX', done, task, 'cancelled') == 1 then
      redis.call('HINCRBY', batch, 'n:cancelled', 1)
      redis.call('XADD', results, '*', 'r', cancelledLine(task, ARGV[6]))
    end
  end
  if state == 'validating' then enter(ARGV[5]); redis.call('SREM', active, id) end
  settle()
  return redis.call('HGET', batch, 'state')
end
return redis.error_reply('unknown batch operation ' .. tostring(op))

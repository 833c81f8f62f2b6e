-- A batch's result bookkeeping, one script so every change is atomic and shares `settle`.
-- Where a task waits, who runs it and when it runs again is BullMQ's (one queue per batch,
-- src/gateway/batches/jobs.ts); this script keeps what BullMQ does not: the counts the
-- scheduler and the API read, each task's one terminal result, and the batch's state.
-- KEYS[1] the batch hash, KEYS[2] its specs (hash customId -> task JSON), KEYS[3] the tasks
-- running now (set), KEYS[4] attempts (hash), KEYS[5] done (hash customId -> status),
-- KEYS[6] results (stream)
-- ARGV[1] the operation, ARGV[2] the batch id, ARGV[3] now (ms), ARGV[4] now (ISO 8601), then the operation's own.
local batch, specs, running, attempts, done, results = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op, nowIso = ARGV[1], ARGV[4]

local function count(field)
  return tonumber(redis.call('HGET', batch, 'n:' .. field) or '0')
end

local function enter(state)
  redis.call('HSET', batch, 'state', state, 'ts:' .. state, nowIso)
end

-- Ends the batch once nothing is queued or running. Answers 1 when it ended here.
local function settle()
  if count('queued') > 0 or count('running') > 0 then return 0 end
  local state = redis.call('HGET', batch, 'state')
  if state == 'in_progress' then
    enter('finalizing')
    enter('completed')
  elseif state == 'cancelling' then
    enter(redis.call('HGET', batch, 'endState') or 'cancelled')
  else
    return 0
  end
  return 1
end

-- A task's one terminal result; false when it already had one.
local function finish(task, status, line)
  if redis.call('HEXISTS', done, task) == 1 then return false end
  if redis.call('SREM', running, task) == 1 then
    redis.call('HINCRBY', batch, 'n:running', -1)
  else
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

if op == 'start' then
  -- validating -> in_progress: its tasks may be fetched from now on. Answers 1, or 0 when it was not validating.
  if redis.call('HGET', batch, 'state') ~= 'validating' then return 0 end
  enter('in_progress')
  return 1
elseif op == 'begin' then
  -- ARGV[5] customId: its job was fetched. Answers the attempt number (this one included),
  -- or 0 when the task has its result already (the job only needs completing).
  local task = ARGV[5]
  if redis.call('HEXISTS', done, task) == 1 then return 0 end
  -- Already in the set: a stalled job fetched again before its release was counted.
  if redis.call('SADD', running, task) == 1 then
    redis.call('HINCRBY', batch, 'n:queued', -1)
    redis.call('HINCRBY', batch, 'n:running', 1)
  end
  return redis.call('HINCRBY', attempts, task, 1)
elseif op == 'finish' then
  -- ARGV[5] customId, ARGV[6] status, ARGV[7] the result line (JSON). Answers {cursor or false, 1 when the batch ended}.
  local cursor = finish(ARGV[5], ARGV[6], ARGV[7])
  return {cursor, settle()}
elseif op == 'release' then
  -- ARGV[5] customId, ARGV[6] '1' to charge the attempt (an infra failure, a stalled job),
  -- '0' to give it back (no room yet, the gateway stopping): its job waits again. When the
  -- batch is being cancelled, the task ends cancelled instead. Answers {released 0/1, ended 0/1}.
  local task = ARGV[5]
  if redis.call('HEXISTS', done, task) == 1 then return {0, 0} end
  if redis.call('SREM', running, task) == 0 then return {0, 0} end
  redis.call('HINCRBY', batch, 'n:running', -1)
  redis.call('HINCRBY', batch, 'n:queued', 1)
  if ARGV[6] == '0' then redis.call('HINCRBY', attempts, task, -1) end
  if redis.call('HGET', batch, 'state') == 'cancelling' then
    finish(task, 'cancelled', cancelledLine(task, 'the batch was cancelled'))
  end
  return {1, settle()}
elseif op == 'cancel' then
  -- ARGV[5] the state to end in (cancelled or expired), ARGV[6] why. Tasks not running end
  -- now, running ones when their runners see it. Answers the batch's state after.
  local state = redis.call('HGET', batch, 'state')
  if state ~= 'in_progress' and state ~= 'validating' then return state end
  enter('cancelling')
  redis.call('HSET', batch, 'endState', ARGV[5])
  -- Every task without a result that is not running: one pass over the specs (linear, so
  -- cancelling 100,000 queued tasks is one script of 100,000 steps, not quadratic).
  local tasks = redis.call('HKEYS', specs)
  for _, task in ipairs(tasks) do
    if redis.call('SISMEMBER', running, task) == 0 and redis.call('HSETNX', done, task, 'cancelled') == 1 then
      redis.call('HINCRBY', batch, 'n:cancelled', 1)
      redis.call('XADD', results, '*', 'r', cancelledLine(task, ARGV[6]))
    end
  end
  redis.call('HSET', batch, 'n:queued', 0)
  if state == 'validating' then enter(ARGV[5]) end
  settle()
  return redis.call('HGET', batch, 'state')
end
return redis.error_reply('unknown batch operation ' .. tostring(op))

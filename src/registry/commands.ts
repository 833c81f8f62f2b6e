import type { Redis } from 'ioredis';
import { CommandRecord, type ExecResult } from '../api/index.ts';
import { keys } from './keys.ts';
import { LuaScript } from './lua.ts';

/** Commands stay replayable this long after they were queued. */
const COMMAND_TTL_SEC = 7 * 24 * 3600;
/** A node's ops inbox key around its id: the claim script completes it with the node it reads. */
const [OPS_INBOX_PREFIX, OPS_INBOX_SUFFIX] = keys.inbox('\0', 'ops').split('\0');

/**
 * Looks the sandbox up, records a new command and puts its operation in the inbox of the
 * sandbox's node, in one step: a command is never recorded without being sent, and the
 * gateway's exec costs one round trip to Redis before the command runs.
 * KEYS: sandbox, command, sandboxLog   ARGV: tenant, inboxPrefix, inboxSuffix, ttl, queuedAtMs,
 *   commandRef, op json, then record fields (the node is added here)
 * Returns {'claimed', node} | {'exists'} (the commandId was used before in this sandbox) |
 *   {'missing'} (no such sandbox of this tenant) | {'state', state, failureReason}.
 */
const CLAIM = new LuaScript(`
local sb = redis.call('HMGET', KEYS[1], 'tenant', 'state', 'node', 'failureReason')
if sb[1] ~= ARGV[1] then return {'missing'} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'exists'} end
if sb[2] ~= 'running' or not sb[3] then return {'state', sb[2], sb[4] or ''} end
redis.call('HSET', KEYS[2], 'node', sb[3], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[4]))
redis.call('ZADD', KEYS[3], tonumber(ARGV[5]), ARGV[6])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[4]))
redis.call('LPUSH', ARGV[2] .. sb[3] .. ARGV[3], ARGV[7])
return {'claimed', sb[3]}
`);

export type ClaimOutcome = { kind: 'claimed'; node: string } | { kind: 'exists' } | { kind: 'missing' } | { kind: 'state'; state: string; failureReason: string };

/** KEYS: command   ARGV: requestId, startedAt. Only the request that queued it may start it, once. */
const START = new LuaScript(`
local cur = redis.call('HMGET', KEYS[1], 'state', 'requestId')
if cur[1] ~= 'queued' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'running', 'startedAt', ARGV[2])
return 1
`);

/**
 * The command's result, its inbox message acknowledged, its gateway told, in one step.
 * KEYS: command, taken (or '')   ARGV: endedAt, result json, taken message (or ''), reply channel, reply json
 * Never overwrites a settled command (one reported unknown stays unknown). Returns 1 if settled now.
 */
const COMPLETE = new LuaScript(`
if KEYS[2] ~= '' then redis.call('LREM', KEYS[2], 1, ARGV[3]) end
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'endedAt', ARGV[1], 'result', ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
`);

/**
 * Its outcome cannot be known (its host died or restarted while it ran): recorded, and the
 * gateway waiting on it told at once. KEYS: command   ARGV: endedAt, replyChannelPrefix, message
 */
const UNKNOWN = new LuaScript(`
local cur = redis.call('HMGET', KEYS[1], 'state', 'replyTo', 'requestId')
if cur[1] ~= 'queued' and cur[1] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'unknown', 'endedAt', ARGV[1])
if cur[2] and cur[3] then
  redis.call('PUBLISH', ARGV[2] .. cur[2], cjson.encode({kind = 'error', requestId = cur[3], error = {code = 'result_unknown', message = ARGV[3]}}))
end
return 1
`);

function commandRef(sandboxId: string, commandId: string): string {
  return `${sandboxId}/${commandId}`;
}

function parseRef(ref: string): [string, string] {
  const at = ref.indexOf('/');
  return [ref.slice(0, at), ref.slice(at + 1)];
}

function fromHash(hash: Record<string, string>): CommandRecord | undefined {
  if (!hash.commandId) return undefined;
  return CommandRecord.parse({
    commandId: hash.commandId,
    argv: JSON.parse(hash.argv ?? '[]'),
    state: hash.state,
    node: hash.node,
    queuedAt: hash.queuedAt,
    startedAt: hash.startedAt,
    endedAt: hash.endedAt,
    result: hash.result ? JSON.parse(hash.result) : undefined,
  });
}

/**
 * The command log: each exec is recorded under its commandId as it is sent, so a re-sent
 * command replays its recorded result instead of running again, and a command whose host
 * died is reported `unknown` rather than silently re-run.
 */
export class CommandLog {
  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * Records a new command as queued in a running sandbox of `tenant` and pushes `op` (its
   * message) to the ops inbox of the sandbox's node; see CLAIM for the other outcomes.
   */
  async claim(input: { sandboxId: string; tenant: string; commandId: string; argv: string[]; requestId: string; replyTo: string; op: string }): Promise<ClaimOutcome> {
    const queuedAtMs = this.now();
    const fields = ['commandId', input.commandId, 'argv', JSON.stringify(input.argv), 'state', 'queued', 'requestId', input.requestId, 'replyTo', input.replyTo, 'queuedAt', new Date(queuedAtMs).toISOString()];
    const [kind, a, b] = (await CLAIM.run(
      this.redis,
      [keys.sandbox(input.sandboxId), keys.command(input.sandboxId, input.commandId), keys.commandLog(input.sandboxId)],
      [input.tenant, OPS_INBOX_PREFIX!, OPS_INBOX_SUFFIX!, COMMAND_TTL_SEC, queuedAtMs, commandRef(input.sandboxId, input.commandId), input.op, ...fields],
    )) as [string, string?, string?];
    if (kind === 'claimed') return { kind, node: a! };
    if (kind === 'state') return { kind, state: a ?? '', failureReason: b ?? '' };
    return { kind: kind as 'exists' | 'missing' };
  }

  /** Moves a queued command to running; false for a redelivered or foreign request (do not run it). */
  async start(sandboxId: string, commandId: string, requestId: string): Promise<boolean> {
    return (await START.run(this.redis, [keys.command(sandboxId, commandId)], [requestId, new Date(this.now()).toISOString()])) === 1;
  }

  /** Records the result, acknowledges the inbox message, and publishes `reply` to the waiting gateway. */
  async complete(
    sandboxId: string,
    result: Omit<ExecResult, 'replayed'>,
    options: { receipt?: { takenKey: string; raw: string }; replyChannel: string; reply: string },
  ): Promise<void> {
    await COMPLETE.run(
      this.redis,
      [keys.command(sandboxId, result.commandId), options.receipt?.takenKey ?? ''],
      [new Date(this.now()).toISOString(), JSON.stringify(result), options.receipt?.raw ?? '', options.replyChannel, options.reply],
    );
  }

  /** The command's outcome cannot be known (its host died or restarted while it ran). */
  async markUnknown(sandboxId: string, commandId: string, why: string): Promise<boolean> {
    return (await UNKNOWN.run(this.redis, [keys.command(sandboxId, commandId)], [new Date(this.now()).toISOString(), keys.replyChannel(''), why])) === 1;
  }

  /** A command refused before it started (sandbox not running there): forget it so it may be sent again. */
  async abandon(sandboxId: string, commandId: string): Promise<void> {
    await this.redis.multi().del(keys.command(sandboxId, commandId)).zrem(keys.commandLog(sandboxId), commandRef(sandboxId, commandId)).exec();
  }

  async get(sandboxId: string, commandId: string): Promise<CommandRecord | undefined> {
    return fromHash(await this.redis.hgetall(keys.command(sandboxId, commandId)));
  }

  /** The sandbox's commands in the order they were sent. */
  async list(sandboxId: string, limit: number): Promise<CommandRecord[]> {
    const refs = await this.redis.zrange(keys.commandLog(sandboxId), '0', String(limit - 1));
    const pipeline = this.redis.pipeline();
    for (const ref of refs) pipeline.hgetall(keys.command(...parseRef(ref)));
    const rows = (await pipeline.exec()) ?? [];
    return rows.flatMap(([, hash]) => fromHash((hash ?? {}) as Record<string, string>) ?? []);
  }

  /**
   * Settles commands a node left unfinished: `running` ones become unknown, and with
   * `includeQueued` (the node is gone) queued ones too; a restarted node keeps its queued
   * ones, its inbox still holds them. `commands` are those of its inbox (src/queues/inbox.ts).
   */
  async settleUnfinished(commands: readonly { sandboxId: string; commandId: string }[], why: string, options: { includeQueued: boolean }): Promise<number> {
    let settled = 0;
    for (const { sandboxId, commandId } of commands) {
      const state = await this.redis.hget(keys.command(sandboxId, commandId), 'state');
      if (state === 'running' || (state === 'queued' && options.includeQueued)) {
        if (await this.markUnknown(sandboxId, commandId, why)) settled++;
      }
    }
    return settled;
  }
}

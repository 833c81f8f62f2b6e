import type { Redis } from 'ioredis';
import { CommandRecord, type ExecResult } from '../api/index.ts';
import { keys } from './keys.ts';

/** Commands stay replayable this long after they were queued. */
const COMMAND_TTL_SEC = 7 * 24 * 3600;

/**
 * KEYS: command, sandboxLog, nodeCommands   ARGV: record fields..., then commandRef, queuedAtMs, ttl
 * Returns {'claimed'} or {'exists'}.
 */
const CLAIM = `
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
local n = #ARGV
local fields = {}
for i = 1, n - 3 do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[n]))
redis.call('ZADD', KEYS[2], tonumber(ARGV[n - 1]), ARGV[n - 2])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[n]))
redis.call('SADD', KEYS[3], ARGV[n - 2])
return {'claimed'}
`;

/** KEYS: command   ARGV: requestId, startedAt. Only the request that queued it may start it, once. */
const START = `
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then return 0 end
if redis.call('HGET', KEYS[1], 'requestId') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'running', 'startedAt', ARGV[2])
return 1
`;

/** KEYS: command, nodeCommands   ARGV: commandRef, state, endedAt, result json (or ''). Never overwrites a settled command. */
const SETTLE = `
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2], 'endedAt', ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[4]) end
redis.call('SREM', KEYS[2], ARGV[1])
return 1
`;

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
 * The command log: each exec is recorded under its commandId before it is sent, so a
 * re-sent command replays its recorded result instead of running again, and a command
 * whose host died is reported `unknown` rather than silently re-run.
 */
export class CommandLog {
  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  /** Records a new command as queued; `exists` when the commandId was used before in this sandbox. */
  async claim(input: { sandboxId: string; commandId: string; argv: string[]; node: string; requestId: string }): Promise<'claimed' | 'exists'> {
    const queuedAtMs = this.now();
    const fields = ['commandId', input.commandId, 'argv', JSON.stringify(input.argv), 'state', 'queued', 'node', input.node, 'requestId', input.requestId, 'queuedAt', new Date(queuedAtMs).toISOString()];
    const ref = commandRef(input.sandboxId, input.commandId);
    const [outcome] = (await this.redis.eval(
      CLAIM,
      3,
      keys.command(input.sandboxId, input.commandId),
      keys.commandLog(input.sandboxId),
      keys.nodeCommands(input.node),
      ...fields,
      ref,
      String(queuedAtMs),
      String(COMMAND_TTL_SEC),
    )) as string[];
    return outcome as 'claimed' | 'exists';
  }

  /** Moves a queued command to running; false for a redelivered or foreign request (do not run it). */
  async start(sandboxId: string, commandId: string, requestId: string): Promise<boolean> {
    return (await this.redis.eval(START, 1, keys.command(sandboxId, commandId), requestId, new Date(this.now()).toISOString())) === 1;
  }

  async complete(sandboxId: string, node: string, result: Omit<ExecResult, 'replayed'>): Promise<void> {
    await this.settle(sandboxId, result.commandId, node, 'done', JSON.stringify(result));
  }

  /** The command's outcome cannot be known (its host died or restarted while it ran). */
  async markUnknown(sandboxId: string, commandId: string, node: string): Promise<void> {
    await this.settle(sandboxId, commandId, node, 'unknown', '');
  }

  /** A command refused before it started (sandbox not running there): forget it so it may be sent again. */
  async abandon(sandboxId: string, commandId: string, node: string): Promise<void> {
    const ref = commandRef(sandboxId, commandId);
    await this.redis.multi().del(keys.command(sandboxId, commandId)).zrem(keys.commandLog(sandboxId), ref).srem(keys.nodeCommands(node), ref).exec();
  }

  private async settle(sandboxId: string, commandId: string, node: string, state: 'done' | 'unknown', resultJson: string): Promise<void> {
    await this.redis.eval(SETTLE, 2, keys.command(sandboxId, commandId), keys.nodeCommands(node), commandRef(sandboxId, commandId), state, new Date(this.now()).toISOString(), resultJson);
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
   * Settles what a node left unfinished. With `includeQueued` (the node is gone) queued
   * commands are settled too; a restarted node keeps them, its queue still holds them.
   */
  async settleUnfinished(node: string, options: { includeQueued: boolean }): Promise<number> {
    let settled = 0;
    for (const ref of await this.redis.smembers(keys.nodeCommands(node))) {
      const [sandboxId, commandId] = parseRef(ref);
      const state = await this.redis.hget(keys.command(sandboxId, commandId), 'state');
      if (state === 'running' || (state === 'queued' && options.includeQueued)) {
        await this.markUnknown(sandboxId, commandId, node);
        settled++;
      } else if (state !== 'queued') {
        await this.redis.srem(keys.nodeCommands(node), ref);
      }
    }
    return settled;
  }
}

import type { Redis } from 'ioredis';
import { CommandRecord, RollboxError, type CommandList, type ExecResult, type PtySize } from '../api/index.ts';
import { keys } from './keys.ts';
import { LuaScript } from '../redis/index.ts';

/** Commands stay replayable this long after they were queued. */
const COMMAND_TTL_SEC = 7 * 24 * 3600;

const CLAIM = new LuaScript(import.meta.dirname, 'claim-command');

export type ClaimOutcome = { kind: 'claimed'; node: string } | { kind: 'exists' } | { kind: 'missing' } | { kind: 'state'; state: string; failureReason: string };

const START = new LuaScript(import.meta.dirname, 'start-command');

const COMPLETE = new LuaScript(import.meta.dirname, 'complete-command');

const UNKNOWN = new LuaScript(import.meta.dirname, 'mark-command-unknown');

const PAGE = new LuaScript(import.meta.dirname, 'page-commands');

/** One page of a command log (CommandList). */
export type CommandPage = CommandList;

/** A position in a command log: after the command queued at `score` (ms) with this id. Opaque to callers. */
function encodeCursor(score: string, commandId: string): string {
  return Buffer.from(JSON.stringify([score, commandId])).toString('base64url');
}

function decodeCursor(cursor: string): [string, string] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    parsed = undefined;
  }
  if (!Array.isArray(parsed) || parsed.length !== 2 || typeof parsed[0] !== 'string' || !/^\d{1,16}$/.test(parsed[0]) || typeof parsed[1] !== 'string') {
    throw new RollboxError('invalid_request', 'query.after: not a cursor of this command log (use a nextCursor it answered)');
  }
  return [parsed[0], parsed[1]];
}

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
    pty: hash.pty ? JSON.parse(hash.pty) : undefined,
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
  async claim(input: { sandboxId: string; tenant: string; commandId: string; argv: string[]; pty?: PtySize; requestId: string; replyTo: string; op: string }): Promise<ClaimOutcome> {
    const queuedAtMs = this.now();
    const fields = ['commandId', input.commandId, 'argv', JSON.stringify(input.argv), 'state', 'queued', 'requestId', input.requestId, 'replyTo', input.replyTo, 'queuedAt', new Date(queuedAtMs).toISOString()];
    if (input.pty) fields.push('pty', JSON.stringify(input.pty));
    const [kind, a, b, c] = (await CLAIM.run(
      this.redis,
      [keys.sandbox(input.sandboxId), keys.command(input.sandboxId, input.commandId), keys.commandLog(input.sandboxId)],
      [input.tenant, COMMAND_TTL_SEC, queuedAtMs, commandRef(input.sandboxId, input.commandId), input.op, ...fields],
    )) as [string, string?, string?, string?];
    if (kind === 'claimed') {
      await this.redis.lpush(keys.inbox(a!, 'ops'), input.op);
      return { kind, node: a! };
    }
    // Recorded by a caller that died before sending it: sent now (a command starts once).
    if (kind === 'exists' && a === 'queued' && b && c) await this.redis.lpush(keys.inbox(b, 'ops'), c);
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
    await COMPLETE.run(this.redis, [keys.command(sandboxId, result.commandId)], [new Date(this.now()).toISOString(), JSON.stringify(result), options.replyChannel, options.reply]);
    // Acknowledged once recorded: a host dying in between finds the message again at its
    // restart, and the recorded command is not run again.
    if (options.receipt) await this.redis.lrem(options.receipt.takenKey, 1, options.receipt.raw);
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

  /** The sandbox's first `limit` commands in the order they were sent. */
  async list(sandboxId: string, limit: number): Promise<CommandRecord[]> {
    return (await this.page(sandboxId, { limit })).commands;
  }

  /**
   * The sandbox's commands in the order they were sent, `limit` at a time: after the
   * position `after` names (a `nextCursor` of an earlier page), or from the first. A log
   * read page by page while commands are sent sees each once (a command sent meanwhile
   * lands after the cursor; across gateways, as far as their clocks agree).
   */
  async page(sandboxId: string, options: { after?: string; limit: number }): Promise<CommandPage> {
    const [score, commandId] = options.after ? decodeCursor(options.after) : ['', ''];
    // One more than asked: whether a next page exists.
    const flat = (await PAGE.run(this.redis, [keys.commandLog(sandboxId)], [score, commandRef(sandboxId, commandId), options.limit + 1])) as string[];
    const refs: { ref: string; score: string }[] = [];
    for (let i = 0; i + 1 < flat.length; i += 2) refs.push({ ref: flat[i]!, score: flat[i + 1]! });
    const page = refs.slice(0, options.limit);
    const pipeline = this.redis.pipeline();
    for (const { ref } of page) pipeline.hgetall(keys.command(...parseRef(ref)));
    const rows = page.length > 0 ? ((await pipeline.exec()) ?? []) : [];
    // A command whose record expired before its log entry is left out; the cursor still moves past it.
    const commands = rows.flatMap(([, hash]) => fromHash((hash ?? {}) as Record<string, string>) ?? []);
    const last = page[page.length - 1];
    const cursor = last ? encodeCursor(last.score, parseRef(last.ref)[1]) : options.after;
    return { commands, ...(refs.length > options.limit ? { nextCursor: cursor } : {}), ...(cursor === undefined ? {} : { cursor }) };
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

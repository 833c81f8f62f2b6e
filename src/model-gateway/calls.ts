import type { Redis } from 'ioredis';
import { LuaScript } from '../redis/index.ts';
import { modelKeys } from './keys.ts';

const joinScript = new LuaScript(import.meta.dirname, 'join');
const finishScript = new LuaScript(import.meta.dirname, 'finish');
const takeoverScript = new LuaScript(import.meta.dirname, 'takeover');
const renewScript = new LuaScript(import.meta.dirname, 'renew');

export type HoldReason = 'paused' | 'unreachable' | 'queued' | 'unbound';

/**
 * What happens to a call, in order, as every client attached to it reads it (in this
 * process, or from the call's Redis stream on another gateway): held and going up,
 * the answer's status, its pieces (stream events, or the whole body), and its end (only
 * once the record is durable).
 */
export type CallEntry = { t: 'held'; reason: HoldReason } | { t: 'going' } | { t: 'head'; status: number; contentType: string } | { t: 'data'; d: string } | { t: 'end' };

export function entryFields(entry: CallEntry): string[] {
  switch (entry.t) {
    case 'held':
      return ['t', 'held', 'r', entry.reason];
    case 'head':
      return ['t', 'head', 's', String(entry.status), 'ct', entry.contentType];
    case 'data':
      return ['t', 'data', 'd', entry.d];
    default:
      return ['t', entry.t];
  }
}

export function entryOf(fields: string[]): CallEntry {
  const map: Record<string, string> = {};
  for (let i = 0; i + 1 < fields.length; i += 2) map[fields[i]!] = fields[i + 1]!;
  if (map.t === 'held') return { t: 'held', reason: map.r as HoldReason };
  if (map.t === 'head') return { t: 'head', status: Number(map.s), contentType: map.ct ?? 'application/json' };
  if (map.t === 'data') return { t: 'data', d: map.d ?? '' };
  return { t: map.t === 'end' ? 'end' : 'going' };
}

export type JoinAnswer = { kind: 'new' | 'join' | 'takeover'; callId: string; turn: number; receivedAtMs: number } | { kind: 'limit'; hit: 'max_model_calls' | 'max_tokens' | 'wall_time' };

export interface CallStoreOptions {
  leaseMs: number;
  recordTtlSeconds: number;
  retryJoinSeconds: number;
  now?: () => number;
}

/**
 * A rollout's model calls in Redis: one per body in flight (a client's retry with the same
 * body joins it, on any gateway), owned by the gateway that runs it under a lease; its
 * answer as a stream other gateways' clients read; its record, written once with the end
 * of that stream.
 */
export class CallStore {
  constructor(
    private readonly redis: Redis,
    private readonly options: CallStoreOptions,
  ) {}

  private get now(): number {
    return (this.options.now ?? Date.now)();
  }

  private get ttl(): number {
    return this.options.recordTtlSeconds;
  }

  async join(rolloutId: string, bodyHash: string, callId: string, owner: string, isRetry: boolean): Promise<JoinAnswer> {
    const reply = (await joinScript.run(this.redis, [modelKeys.inflight(rolloutId, bodyHash), modelKeys.turns(rolloutId), modelKeys.usage(rolloutId)], [callId, owner, this.now, this.options.leaseMs, isRetry ? '1' : '0', this.ttl])) as string[];
    if (reply[0] === 'limit') return { kind: 'limit', hit: reply[1] as 'max_model_calls' };
    return { kind: reply[0] as 'new', callId: reply[1]!, turn: Number(reply[2]), receivedAtMs: Number(reply[3]) };
  }

  /** Renews the owner's lease; false: the call is not this owner's any more. */
  async renew(rolloutId: string, bodyHash: string, callId: string, owner: string): Promise<boolean> {
    return (await renewScript.run(this.redis, [modelKeys.inflight(rolloutId, bodyHash)], [callId, owner, this.now + this.options.leaseMs])) === 1;
  }

  /** Takes over a call whose owner's lease lapsed; false: it ended, or its owner is alive. */
  async takeover(rolloutId: string, bodyHash: string, callId: string, owner: string): Promise<boolean> {
    return (await takeoverScript.run(this.redis, [modelKeys.inflight(rolloutId, bodyHash)], [callId, owner, this.now, this.options.leaseMs])) === 1;
  }

  async leaseOf(rolloutId: string, bodyHash: string): Promise<{ callId: string; state: string; leaseUntil: number } | null> {
    const [callId, state, leaseUntil] = await this.redis.hmget(modelKeys.inflight(rolloutId, bodyHash), 'callId', 'state', 'leaseUntil');
    return callId ? { callId, state: state ?? '', leaseUntil: Number(leaseUntil) } : null;
  }

  /** Appends to the call's stream (what clients on other gateways read). */
  async append(rolloutId: string, callId: string, entries: readonly CallEntry[]): Promise<void> {
    if (entries.length === 0) return;
    const key = modelKeys.output(rolloutId, callId);
    const pipeline = this.redis.pipeline();
    for (const entry of entries) pipeline.xadd(key, '*', ...entryFields(entry));
    await pipeline.expire(key, this.ttl).exec();
  }

  /**
   * The record, with the rest of the call's stream and its end, in one script: the end
   * (and with it the stream's terminal event) reaches no client before the record is
   * durable. 'lost': another gateway took the call over meanwhile, and records it.
   */
  async finish(rolloutId: string, bodyHash: string, callId: string, owner: string, recordJson: string, tokens: number, entries: readonly CallEntry[]): Promise<{ seq: number; retriesJoined: number } | 'lost'> {
    const keys = [modelKeys.inflight(rolloutId, bodyHash), modelKeys.usage(rolloutId), modelKeys.records(rolloutId), modelKeys.log(rolloutId), modelKeys.output(rolloutId, callId)];
    const args: (string | number)[] = [callId, owner, recordJson, tokens, this.ttl, Math.max(60, this.options.retryJoinSeconds), this.now, entries.length];
    for (const entry of entries) {
      const fields = entryFields(entry);
      args.push(fields.length / 2, ...fields);
    }
    const reply = (await finishScript.run(this.redis, keys, args)) as [number, number] | ['lost'];
    return reply[0] === 'lost' ? 'lost' : { seq: Number(reply[0]), retriesJoined: Number(reply[1]) };
  }

  /** Entries of a call's stream after `afterId` ('0': from its start). */
  async read(rolloutId: string, callId: string, afterId: string): Promise<{ id: string; entry: CallEntry }[]> {
    const rows = (await this.redis.xrange(modelKeys.output(rolloutId, callId), afterId === '0' ? '-' : `(${afterId}`, '+', 'COUNT', 500)) as [string, string[]][];
    return rows.map(([id, fields]) => ({ id, entry: entryOf(fields) }));
  }

  /** Waits up to `blockMs` for entries after `afterId` (XREAD BLOCK on a connection nothing else uses meanwhile). */
  async follow(blocking: Redis, rolloutId: string, callId: string, afterId: string, blockMs: number): Promise<{ id: string; entry: CallEntry }[]> {
    const reply = (await blocking.xread('COUNT', 500, 'BLOCK', blockMs, 'STREAMS', modelKeys.output(rolloutId, callId), afterId)) as [string, [string, string[]][]][] | null;
    return (reply?.[0]?.[1] ?? []).map(([id, fields]) => ({ id, entry: entryOf(fields) }));
  }
}

/** Consecutive stream events as one entry (one XADD for a burst: their text joined is the same stream). */
export function coalesce(entries: readonly CallEntry[]): CallEntry[] {
  const out: CallEntry[] = [];
  for (const entry of entries) {
    const last = out.at(-1);
    if (entry.t === 'data' && last?.t === 'data') out[out.length - 1] = { t: 'data', d: last.d + entry.d };
    else out.push(entry);
  }
  return out;
}


import net from 'node:net';
import { Redis, type RedisOptions } from 'ioredis';
import type { Logger } from 'pino';
import { parseRedisTarget } from './connect.ts';

/** Why Redis cannot be used yet, as an operator would put it. */
export interface RedisWaitState {
  /** refused, dns, timeout, protected_mode, loading, cluster_down (a Redis Cluster not serving every slot), or other */
  reason: string;
  error: string;
}

/** A Redis URL as logs and answers may show it: no password. */
export function redactedRedisUrl(url: string): string {
  // A cluster's node list (a,b,c) is no URL host to the WHATWG parser: the userinfo by hand.
  if (url.toLowerCase().startsWith('redis+cluster://')) {
    try {
      const target = parseRedisTarget(url);
      if (target.kind !== 'cluster') return 'redis+cluster://(unparseable url)';
      const user = target.username === undefined ? '' : encodeURIComponent(target.username);
      const userinfo = target.password !== undefined ? `${user}:***@` : user ? `${user}@` : '';
      return `redis+cluster://${userinfo}${target.nodes.map((n) => `${n.host.includes(':') ? `[${n.host}]` : n.host}:${n.port}`).join(',')}`;
    } catch {
      return 'redis+cluster://(unparseable url)';
    }
  }
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return 'redis://(unparseable url)';
  }
}

/** Refusals no wait will cure: the process should say so and exit. */
const FATAL = /^(NOAUTH|WRONGPASS|NOPERM)\b|invalid password|ERR AUTH/i;

function classify(err: unknown): RedisWaitState {
  const message = err instanceof Error ? err.message : String(err);
  const code = (err as NodeJS.ErrnoException | undefined)?.code ?? '';
  if (code === 'ECONNREFUSED' || /ECONNREFUSED/.test(message)) return { reason: 'refused', error: message };
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN' || /ENOTFOUND|EAI_AGAIN/.test(message)) return { reason: 'dns', error: message };
  if (/protected mode/i.test(message)) return { reason: 'protected_mode', error: message.split('\n')[0]!.slice(0, 300) };
  if (/^LOADING/.test(message)) return { reason: 'loading', error: message };
  if (/^CLUSTERDOWN|cluster_state:/.test(message)) return { reason: 'cluster_down', error: message.slice(0, 300) };
  if (/timeout|ETIMEDOUT/i.test(message)) return { reason: 'timeout', error: message };
  return { reason: 'other', error: message.slice(0, 300) };
}

/**
 * What a Redis says to a plain PING on a fresh connection, when it refuses before any
 * client could read it: a Redis in protected mode writes `-DENIED ...` and closes, which
 * ioredis reports only as EPIPE or "Connection is closed". Plain `redis://` only.
 */
async function refusalOnConnect(url: string, timeoutMs = 1000): Promise<string | undefined> {
  let target: URL;
  try {
    target = new URL(url);
  } catch {
    return undefined;
  }
  if (target.protocol !== 'redis:') return undefined;
  return new Promise((resolve) => {
    let reply = '';
    const socket = net.connect({ host: target.hostname.replace(/^\[|\]$/g, ''), port: Number(target.port || 6379) });
    const done = () => {
      socket.destroy();
      resolve(reply.startsWith('-DENIED') ? reply.slice(1).split(/\r?\n/)[0]!.split('. ')[0] : undefined);
    };
    socket.setTimeout(timeoutMs, done);
    socket.on('connect', () => socket.write('PING\r\n'));
    socket.on('data', (d: Buffer) => {
      reply += d.toString('latin1');
      if (reply.length > 4096 || reply.includes('\n')) done();
    });
    socket.on('error', done);
    socket.on('close', done);
  });
}

/** One PING on a fresh connection; throws what made it fail (the error event's cause, not "Connection is closed."). */
async function pingOnce(url: string, options: RedisOptions): Promise<void> {
  const probe = new Redis(url, options);
  // ioredis answers a failed connect with "Connection is closed."; the cause is the error event's.
  let cause: unknown;
  probe.on('error', (err) => (cause ??= err));
  try {
    await probe.connect();
    await probe.ping();
  } catch (caught) {
    throw cause ?? caught;
  } finally {
    probe.disconnect();
  }
}

/**
 * Whether Redis at `url` can be used now: one Redis answers PING; a Redis Cluster
 * (`redis+cluster://`) has a seed node that answers `CLUSTER INFO` with `cluster_state:ok`
 * (every slot served), asked of each seed in turn. Throws the last seed's error.
 */
async function probeOnce(url: string): Promise<void> {
  const options: RedisOptions = { lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0, enableOfflineQueue: false, connectTimeout: 2000, enableAutoPipelining: false };
  const target = parseRedisTarget(url);
  if (target.kind === 'single') return pingOnce(url, options);
  let lastError: unknown;
  for (const node of target.nodes) {
    const probe = new Redis({ ...options, host: node.host, port: node.port, ...(target.username !== undefined && { username: target.username }), ...(target.password !== undefined && { password: target.password }) });
    let cause: unknown;
    probe.on('error', (err) => (cause ??= err));
    try {
      await probe.connect();
      const info = String(await probe.call('CLUSTER', 'INFO'));
      const state = /^cluster_state:(\w+)/m.exec(info)?.[1];
      if (state === 'ok') return;
      lastError = new Error(`${node.host}:${node.port} says cluster_state:${state ?? '(none)'}`);
    } catch (caught) {
      lastError = cause ?? caught;
      // A wrong password is wrong at every seed.
      if (FATAL.test(lastError instanceof Error ? lastError.message : String(lastError))) throw lastError;
    } finally {
      probe.disconnect();
    }
  }
  throw lastError;
}

export class RedisRefusedError extends Error {
  constructor(url: string, message: string) {
    super(`Redis at ${redactedRedisUrl(url)} refused this process: ${message} (check the password or ACL in REDIS_URL)`);
    this.name = 'RedisRefusedError';
  }
}

/**
 * Waits until Redis at `url` answers PING (a Redis Cluster: see probeOnce), logging every `logEveryMs` which Redis it waits
 * for and the last error (refused, DNS, timeout, protected mode), and telling `onState`
 * (a gateway's /readyz). A refusal no wait will cure (wrong password, an ACL) throws
 * RedisRefusedError. Without this a process whose Redis is away would sit in ioredis's
 * reconnect loop, printing nothing.
 */
export async function waitForRedis(url: string, options: { logger: Logger; what: string; logEveryMs?: number; retryMs?: number; onState?: (state: RedisWaitState | undefined) => void; signal?: AbortSignal }): Promise<void> {
  const logEveryMs = options.logEveryMs ?? 3000;
  let lastLogMs = -Infinity;
  const startedMs = Date.now();
  const report = (state: RedisWaitState): void => {
    options.onState?.(state);
    if (Date.now() - lastLogMs < logEveryMs) return;
    lastLogMs = Date.now();
    options.logger.warn({ redis: redactedRedisUrl(url), reason: state.reason, error: state.error, waitedMs: Date.now() - startedMs }, `${options.what}: waiting for Redis`);
  };
  parseRedisTarget(url); // a malformed cluster node list throws now: no wait cures it
  let denied = false;
  for (let attempt = 0; ; attempt++) {
    if (options.signal?.aborted) throw new Error(`${options.what}: stopped while waiting for Redis`);
    // Still in protected mode: asked without ioredis, which warns on stderr at every such refusal.
    const stillDenied = denied ? await refusalOnConnect(url) : undefined;
    if (stillDenied) {
      report({ reason: 'protected_mode', error: stillDenied });
      await new Promise((r) => setTimeout(r, options.retryMs ?? 500));
      continue;
    }
    try {
      await probeOnce(url);
      if (attempt > 0) options.logger.info({ redis: redactedRedisUrl(url), waitedMs: Date.now() - startedMs }, `${options.what}: Redis answers`);
      options.onState?.(undefined);
      return;
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      if (FATAL.test(message)) throw new RedisRefusedError(url, message);
      let state = classify(err);
      const refusal = state.reason === 'other' ? await refusalOnConnect(url) : undefined;
      if (refusal) state = { reason: 'protected_mode', error: refusal };
      denied = state.reason === 'protected_mode';
      report(state);
    }
    await new Promise((r) => setTimeout(r, options.retryMs ?? 500));
  }
}

/**
 * An error that says Redis cannot serve now rather than that rollbox is wrong: a closed or
 * failed connection, a cluster without a primary for a slot (CLUSTERDOWN, a failover's
 * redirections running out), a server still loading or a replica that was asked to write.
 * The gateway answers these `unavailable` (retry later), not `internal`.
 */
export function isRedisUnavailable(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  if (['MaxRetriesPerRequestError', 'ClusterAllFailedError'].includes(err.name)) return true;
  return /^(CLUSTERDOWN|TRYAGAIN|LOADING|READONLY|MASTERDOWN)\b|^Connection is closed|^Too many Cluster redirections|^Failed to refresh slots cache|^None of startup nodes is available|ECONNREFUSED|ECONNRESET/.test(err.message);
}

/**
 * Runs `step` again while Redis is unavailable (a failover takes seconds), backing off to
 * 2 s, until `untilMs` or `stopped()`. For steps that are safe to repeat: a model call's
 * record (nothing was acknowledged to the agent meanwhile), a hosted rollout's wait on its
 * agent's command by id and its outcome read (failing the attempt instead would delete its
 * sandboxes, and the rollout would start over under a new id).
 */
export async function whileRedisAway<T>(step: () => Promise<T>, o: { untilMs: number; now: () => number; stopped: () => boolean; onWait: (err: Error) => void }): Promise<T> {
  for (let waitMs = 100; ; waitMs = Math.min(2000, waitMs * 2)) {
    try {
      return await step();
    } catch (err) {
      if (!isRedisUnavailable(err) || o.stopped() || o.now() + waitMs > o.untilMs) throw err;
      o.onWait(err as Error);
      await new Promise((r) => setTimeout(r, waitMs));
    }
  }
}

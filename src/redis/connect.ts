import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';

/** What a REDIS_URL names: one Redis (any URL ioredis takes), or a Redis Cluster by its seed nodes. */
export type RedisTarget =
  | { kind: 'single'; url: string }
  | { kind: 'cluster'; nodes: { host: string; port: number }[]; username?: string; password?: string };

const CLUSTER_SCHEME = 'redis+cluster://';

function decode(part: string, what: string, url: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new Error(`invalid Redis Cluster URL: the ${what} is not valid percent-encoding (${redactedTarget(url)})`);
  }
}

/** The URL with any password hidden, for the errors below (wait.ts has the general one). */
function redactedTarget(url: string): string {
  const rest = url.slice(CLUSTER_SCHEME.length);
  const at = rest.lastIndexOf('@');
  if (at < 0) return url;
  const userinfo = rest.slice(0, at);
  const colon = userinfo.indexOf(':');
  return `${CLUSTER_SCHEME}${colon < 0 ? userinfo : `${userinfo.slice(0, colon)}:***`}@${rest.slice(at + 1)}`;
}

/**
 * Reads a Redis URL. `redis+cluster://[user:password@]host:port,host:port,...` names a
 * Redis Cluster by seed nodes (any few of its nodes: the client learns the rest from
 * them); user and password are percent-encoded as in any URL, a host may be an IPv6
 * address in brackets, and every port is required. Anything else is one Redis
 * (`redis://`, `rediss://`, as ioredis reads it). Throws on a malformed cluster list.
 */
export function parseRedisTarget(url: string): RedisTarget {
  if (!url.toLowerCase().startsWith(CLUSTER_SCHEME)) return { kind: 'single', url };
  let rest = url.slice(CLUSTER_SCHEME.length);
  if (rest.endsWith('/')) rest = rest.slice(0, -1);
  if (/[/?#]/.test(rest)) throw new Error(`invalid Redis Cluster URL: no path, database or query after the node list (a cluster has only database 0): ${redactedTarget(url)}`);
  let username: string | undefined;
  let password: string | undefined;
  // The last '@': a password may hold one (percent-encoded or not), a host list cannot.
  const at = rest.lastIndexOf('@');
  if (at >= 0) {
    const userinfo = rest.slice(0, at);
    rest = rest.slice(at + 1);
    const colon = userinfo.indexOf(':');
    const user = colon < 0 ? userinfo : userinfo.slice(0, colon);
    if (user) username = decode(user, 'user name', url);
    if (colon >= 0) password = decode(userinfo.slice(colon + 1), 'password', url);
  }
  if (!rest) throw new Error(`invalid Redis Cluster URL: no nodes (expected ${CLUSTER_SCHEME}host:port,host:port,...): ${redactedTarget(url)}`);
  const nodes = rest.split(',').map((entry, i) => {
    const m = /^(\[[0-9a-fA-F:.]+\]|[^[\]:@\s]+):(\d{1,5})$/.exec(entry);
    const port = m ? Number(m[2]) : NaN;
    if (!m || port < 1 || port > 65_535) {
      throw new Error(`invalid Redis Cluster URL: node ${i + 1} (${JSON.stringify(entry)}) is not host:port (expected ${CLUSTER_SCHEME}host:port,host:port,...): ${redactedTarget(url)}`);
    }
    return { host: m[1]!.replace(/^\[|\]$/g, ''), port };
  });
  return { kind: 'cluster', nodes, ...(username !== undefined && { username }), ...(password !== undefined && { password }) };
}

/**
 * The cluster client's options from the per-connection options a caller gives: what
 * ioredis's Cluster takes at its own level moves there, the rest goes to every node
 * connection (`redisOptions`). `retryStrategy` has no per-node meaning in a cluster (a
 * node that goes away is replaced by what the slot map says): it becomes the cluster's.
 */
function clusterOptions(target: Extract<RedisTarget, { kind: 'cluster' }>, options: RedisOptions): ClusterOptions {
  const { enableAutoPipelining, autoPipeliningIgnoredCommands, enableOfflineQueue, enableReadyCheck, lazyConnect, retryStrategy, scripts, keyPrefix, ...perNode } = options;
  return {
    enableAutoPipelining: enableAutoPipelining ?? true,
    ...(autoPipeliningIgnoredCommands && { autoPipeliningIgnoredCommands }),
    ...(enableOfflineQueue !== undefined && { enableOfflineQueue }),
    ...(enableReadyCheck !== undefined && { enableReadyCheck }),
    ...(lazyConnect !== undefined && { lazyConnect }),
    ...(scripts && { scripts }),
    ...(keyPrefix !== undefined && { keyPrefix }),
    // Reconnect to the seed list for ever (as a single Redis connection does), backing off to 2 s.
    clusterRetryStrategy: retryStrategy === undefined ? (times: number) => Math.min(100 * times, 2000) : retryStrategy && ((times: number) => retryStrategy(times)),
    // A node that is failing over answers the slot map slowly; 1 s (the default) gives up too early.
    slotsRefreshTimeout: 2000,
    // Every read from the primary: a replica's answer may be behind what this process just wrote.
    scaleReads: 'master',
    // A command to a primary that just died is retried every 300 ms, up to 50 tries in
    // all (redirections included): about 15 s, which covers a replica's takeover
    // (cluster-node-timeout plus an election). ioredis's defaults (100 ms, 16) give up
    // after ~1.5 s with "Connection is closed.", before any takeover could finish.
    retryDelayOnFailover: 300,
    retryDelayOnClusterDown: 300,
    maxRedirections: 50,
    redisOptions: {
      maxRetriesPerRequest: null,
      ...perNode,
      ...(target.username !== undefined && { username: target.username }),
      ...(target.password !== undefined && { password: target.password }),
    },
  };
}

/**
 * One place that opens Redis connections, so every connection gets the same options.
 * `maxRetriesPerRequest: null` is what BullMQ requires of its blocking connections and
 * is harmless elsewhere: commands wait for a reconnect instead of failing at once.
 * Connection errors go to `onError` (ioredis reconnects by itself); without a listener
 * ioredis would print every failed reconnect attempt.
 *
 * A `redis+cluster://` URL (see parseRedisTarget) opens an ioredis Cluster instead.
 */
export function connectRedis(url: string, options: RedisOptions = {}, onError: (err: Error) => void = () => {}): Redis {
  const target = parseRedisTarget(url);
  if (target.kind === 'cluster') {
    const cluster = new Cluster(target.nodes, clusterOptions(target, options));
    cluster.on('error', onError);
    // The one cast between the two: a Cluster has the same command API as a Redis (both
    // are ioredis Commanders: commands, multi/pipeline, pub/sub, duplicate, quit), which
    // is all the callers use, and BullMQ takes either. What a Cluster lacks (a single
    // `options.host`, `select`, Redis-only fields) no caller reads.
    return cluster as unknown as Redis;
  }
  const connection = new Redis(url, { maxRetriesPerRequest: null, enableAutoPipelining: true, ...options });
  connection.on('error', onError);
  return connection;
}

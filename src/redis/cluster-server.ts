import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { Redis } from 'ioredis';
import { processAlive } from '../proc/index.ts';
import { startRedisServer, type RedisServerHandle } from './server.ts';

export interface RedisClusterNode {
  port: number;
  pid: number;
  /** The node's cluster id (CLUSTER NODES). */
  id: string;
  role: 'primary' | 'replica';
  /** Slot ranges a primary serves, `[first, last]` inclusive. */
  slots?: [number, number][];
  /** A replica's primary, by port. */
  primaryPort?: number;
  /** The cluster marks it failed (`fail` flag), e.g. after kill(). */
  failed: boolean;
}

export interface RedisClusterHandle {
  /** `redis+cluster://127.0.0.1:p1,...`: the primaries at start first, then the replicas. */
  url: string;
  /** Every node's port, in the order of `url`. */
  ports: number[];
  /** Roles as the cluster sees them now (CLUSTER NODES of a node that still answers). */
  nodes(): Promise<RedisClusterNode[]>;
  /** Signals one node's process; resolves once it has exited (for a signal that ends it). */
  kill(port: number, signal?: NodeJS.Signals): Promise<void>;
  /** Stops every node it started, by pid. Safe to call twice. */
  stop(): Promise<void>;
}

export const CLUSTER_SLOTS = 16_384;

/** Distinct free loopback ports: all held open together, so none is handed out twice. */
async function freePorts(count: number): Promise<number[]> {
  const servers: net.Server[] = [];
  try {
    for (let i = 0; i < count; i++) {
      const srv = net.createServer();
      servers.push(srv);
      await new Promise<void>((resolve, reject) => {
        srv.once('error', reject);
        srv.listen(0, '127.0.0.1', () => resolve());
      });
    }
    return servers.map((s) => (s.address() as net.AddressInfo).port);
  } finally {
    await Promise.all(servers.map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
  }
}

function probe(port: number): Redis {
  const redis = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, enableOfflineQueue: false, connectTimeout: 1000, enableAutoPipelining: false });
  redis.on('error', () => {});
  return redis;
}

function infoField(info: string, field: string): string | undefined {
  return new RegExp(`^${field}:(.*)$`, 'm').exec(info)?.[1]?.trim();
}

interface ParsedNode {
  id: string;
  port: number;
  flags: string[];
  primaryId: string | undefined;
  slots: [number, number][];
}

/** CLUSTER NODES: `<id> <ip:port@cport[,hostname]> <flags> <primary> <ping> <pong> <epoch> <link> <slot>...` */
function parseClusterNodes(text: string): ParsedNode[] {
  return text
    .split('\n')
    .map((line) => line.trim())
    .filter(Boolean)
    .map((line) => {
      const [id, address, flags, primary, , , , , ...slotFields] = line.split(' ');
      const port = Number(/:(\d+)@/.exec(address ?? '')?.[1]);
      const slots = slotFields
        .filter((s) => !s.startsWith('[')) // [slot->-id] are slots being migrated
        .map((s): [number, number] => {
          const [first, last] = s.split('-');
          return [Number(first), Number(last ?? first)];
        });
      return { id: id!, port, flags: (flags ?? '').split(','), primaryId: primary && primary !== '-' ? primary : undefined, slots };
    });
}

async function runRedisCli(args: string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile('redis-cli', args, { timeout: timeoutMs, maxBuffer: 4 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`redis-cli ${args.slice(0, 2).join(' ')} failed: ${err.message}\n${stdout.slice(-2000)}${stderr.slice(-2000)}`));
      else resolve(stdout);
    });
  });
}

/**
 * Starts a private Redis Cluster on loopback for tests: `primaries * (1 + replicasPerPrimary)`
 * redis-servers (each in `<dataDir>/node-<i>`, its cluster bus on a port of its own), joined
 * by `redis-cli --cluster create`, and waits (20 s at most) until every node says
 * `cluster_state:ok` with all 16384 slots assigned and every replica's link to its primary
 * is up. On any failure everything it started is stopped before it throws. A short
 * `nodeTimeoutMs` makes a replica take over a killed primary within a few seconds.
 */
export async function startRedisCluster(opts: { dataDir: string; primaries?: number; replicasPerPrimary?: number; nodeTimeoutMs?: number; appendfsync?: 'always' | 'everysec' | 'no'; readyTimeoutMs?: number }): Promise<RedisClusterHandle> {
  const primaries = opts.primaries ?? 3;
  const replicasPerPrimary = opts.replicasPerPrimary ?? 1;
  const nodeTimeoutMs = opts.nodeTimeoutMs ?? 1500;
  const readyTimeoutMs = opts.readyTimeoutMs ?? 20_000;
  // redis-cli --cluster create refuses fewer than three primaries.
  if (!Number.isInteger(primaries) || primaries < 3) throw new Error(`a Redis Cluster needs at least 3 primaries (got ${primaries})`);
  if (!Number.isInteger(replicasPerPrimary) || replicasPerPrimary < 0) throw new Error(`replicasPerPrimary must be an integer >= 0 (got ${replicasPerPrimary})`);
  const total = primaries * (1 + replicasPerPrimary);
  await fs.mkdir(opts.dataDir, { recursive: true });

  const servers = new Map<number, RedisServerHandle>();
  // A test process that dies without stop() must not leave the nodes behind (they run
  // in their own process groups, see server.ts): killed on this process's exit.
  const killOnExit = (): void => {
    for (const s of servers.values()) {
      try {
        process.kill(s.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  };
  process.on('exit', killOnExit);
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      await Promise.allSettled([...servers.values()].map((s) => s.stop()));
      process.off('exit', killOnExit);
    })();
    return stopping;
  };

  try {
    // A node's cluster bus is on port+10000 unless told otherwise, which may be taken
    // or above 65535: each gets a free one (`--cluster-port`, Redis 7).
    const allPorts = await freePorts(total * 2);
    const ports = allPorts.slice(0, total);
    const started = await Promise.allSettled(
      ports.map(async (port, i) => {
        const dataDir = path.join(opts.dataDir, `node-${i}`);
        const server = await startRedisServer({
          dataDir,
          port,
          ...(opts.appendfsync && { appendfsync: opts.appendfsync }),
          extraArgs: [
            '--cluster-enabled', 'yes',
            '--cluster-config-file', path.resolve(dataDir, `nodes-${port}.conf`),
            '--cluster-node-timeout', String(nodeTimeoutMs),
            '--cluster-port', String(allPorts[total + i]),
          ],
        });
        servers.set(port, server);
      }),
    );
    const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;

    await runRedisCli(['--cluster', 'create', ...ports.map((p) => `127.0.0.1:${p}`), '--cluster-replicas', String(replicasPerPrimary), '--cluster-yes'], 30_000);

    // Until every node agrees: all slots served, every node known, every replica linked.
    const probes = ports.map(probe);
    let seen = '';
    let parsed: ParsedNode[] = [];
    try {
      const deadline = Date.now() + readyTimeoutMs;
      for (;;) {
        const states = await Promise.all(
          probes.map(async (p, i) => {
            try {
              if (p.status === 'wait' || p.status === 'end' || p.status === 'close') {
                if (p.status !== 'wait') p.disconnect();
                await p.connect();
              }
              const info = String(await p.call('CLUSTER', 'INFO'));
              const state = infoField(info, 'cluster_state');
              const assigned = Number(infoField(info, 'cluster_slots_assigned'));
              const known = Number(infoField(info, 'cluster_known_nodes'));
              const replication = await p.info('replication');
              const role = infoField(replication, 'role');
              const link = role === 'slave' ? infoField(replication, 'master_link_status') : 'n/a';
              const ok = state === 'ok' && assigned === CLUSTER_SLOTS && known === total && (role === 'master' || link === 'up');
              return { ok, text: `${ports[i]}: cluster_state:${state} slots_assigned:${assigned} known_nodes:${known} role:${role} master_link_status:${link}` };
            } catch (err) {
              return { ok: false, text: `${ports[i]}: ${(err as Error).message}` };
            }
          }),
        );
        seen = states.map((s) => s.text).join('; ');
        if (states.every((s) => s.ok)) {
          parsed = parseClusterNodes(String(await probes[0]!.call('CLUSTER', 'NODES')));
          break;
        }
        if (Date.now() > deadline) throw new Error(`the Redis Cluster was not ready within ${readyTimeoutMs} ms: ${seen}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      for (const p of probes) p.disconnect();
    }

    const primaryPorts = parsed.filter((n) => n.flags.includes('master')).map((n) => n.port);
    const order = [...primaryPorts, ...ports.filter((p) => !primaryPorts.includes(p))];
    const url = `redis+cluster://${order.map((p) => `127.0.0.1:${p}`).join(',')}`;

    return {
      url,
      ports: order,
      async nodes() {
        let lastError: unknown;
        for (const port of order) {
          const server = servers.get(port)!;
          if (!processAlive(server.pid)) continue;
          const p = probe(port);
          try {
            await p.connect();
            const list = parseClusterNodes(String(await p.call('CLUSTER', 'NODES')));
            const byId = new Map(list.map((n) => [n.id, n]));
            return list
              .filter((n) => servers.has(n.port))
              .map((n): RedisClusterNode => {
                const primary = n.primaryId ? byId.get(n.primaryId) : undefined;
                return {
                  port: n.port,
                  pid: servers.get(n.port)!.pid,
                  id: n.id,
                  role: n.flags.includes('master') ? 'primary' : 'replica',
                  ...(n.flags.includes('master') && { slots: n.slots }),
                  ...(primary && { primaryPort: primary.port }),
                  failed: n.flags.includes('fail'),
                };
              })
              .sort((a, b) => order.indexOf(a.port) - order.indexOf(b.port));
          } catch (err) {
            lastError = err;
          } finally {
            p.disconnect();
          }
        }
        throw new Error(`no node of the Redis Cluster answers CLUSTER NODES: ${(lastError as Error | undefined)?.message ?? 'all stopped'}`);
      },
      async kill(port, signal = 'SIGKILL') {
        const server = servers.get(port);
        if (!server) throw new Error(`no node of this Redis Cluster on port ${port}`);
        if (!processAlive(server.pid)) return;
        process.kill(server.pid, signal);
        if (signal !== 'SIGKILL' && signal !== 'SIGTERM' && signal !== 'SIGINT') return;
        const deadline = Date.now() + 10_000;
        while (processAlive(server.pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}


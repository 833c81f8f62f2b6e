import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { loadConfig, type Config } from '../../src/config/index.ts';
import { createTokenIssuer } from '../../src/iam/index.ts';
import type { NodeHeartbeat, Scope } from '../../src/api/index.ts';
import { ensureBaseLayer, startGatewayRole, startWorkerRole, type GatewayHandle, type WorkerHandle } from '../../src/roles/index.ts';
import { startRedisCluster, startRedisServer, type RedisClusterHandle, type RedisServerHandle } from '../../src/redis/index.ts';

const REPO_ROOT = path.resolve(import.meta.dirname, '../..');

/** Fast heartbeats so node loss and assumed-load clearing happen within a test. */
const TEST_ENV = {
  ROLLBOX_HEARTBEAT_MS: '200',
  ROLLBOX_NODE_LOST_AFTER_MS: '1500',
  ROLLBOX_LOG_LEVEL: 'silent',
  ROLLBOX_PORT: '0',
};

export interface TestWorkerOptions {
  nodeId: string;
  env?: Record<string, string>;
}

export interface SpawnedWorkerOptions extends TestWorkerOptions {
  /** A network namespace (name under /run/netns) the worker runs in; its env must then reach Redis (REDIS_URL). */
  netns?: string;
  /** `--destroy-on-exit`: its sandboxes end with it (and its network state with them). */
  destroyOnExit?: boolean;
}

export interface TestCluster {
  url: string;
  redisUrl: string;
  /** The redis-server's pid (a new one after restartRedis). */
  redisPid(): number;
  /** With `redisCluster`: the Redis Cluster (3 primaries, a replica each) the stack runs on. */
  redisCluster?: RedisClusterHandle;
  rootDir: string;
  config: Config;
  token(tenant: string, scopes: Scope[], ttlSeconds?: number): Promise<string>;
  /** Starts a worker host in this process. */
  addWorker(options: TestWorkerOptions): Promise<WorkerHandle>;
  /**
   * Starts a worker host as its own `rollbox worker` process (so a test can SIGKILL it),
   * optionally inside a network namespace standing for another host.
   */
  spawnWorker(options: SpawnedWorkerOptions): Promise<ChildProcess>;
  /** Starts a gateway as its own `rollbox gateway` process (so a test can SIGKILL it); resolves with it and its URL. */
  spawnGateway(options: { name: string; env?: Record<string, string>; /** Node's own flags (`--cpu-prof`, ...). */ nodeArgs?: string[] }): Promise<{ child: ChildProcess; url: string }>;
  workerConfig(options: TestWorkerOptions): Config;
  /** Stops the gateway; `startGateway` brings it back on the same port. */
  stopGateway(): Promise<void>;
  startGateway(): Promise<void>;
  /** Stops redis-server and starts it again on the same port and data (its AOF). */
  restartRedis(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * A real cluster for integration tests: its own redis-server on a free port, the busybox
 * base layer, one gateway and the worker hosts a test asks for. Everything lives under
 * one temp dir and `stop()` removes every container, mount and process it started.
 */
export async function startTestCluster(options: { workers?: TestWorkerOptions[]; env?: Record<string, string>; redisCluster?: boolean } = {}): Promise<TestCluster> {
  const rootDir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-test-'));
  const layerStore = path.join(rootDir, 'layers');
  const env = { ...TEST_ENV, ROLLBOX_LAYER_STORE: layerStore, ROLLBOX_JWT_SECRET_FILE: path.join(rootDir, 'jwt-secret'), ...options.env };
  const config = loadConfig({}, { ...env, ROLLBOX_DATA_DIR: path.join(rootDir, 'gateway') });
  // ROLLBOX_TEST_LOG=warn (or error, info) shows the in-process gateway's and workers' logs.
  const logger = pino({ level: process.env.ROLLBOX_TEST_LOG ?? 'silent' });
  const workers: WorkerHandle[] = [];
  const children: ChildProcess[] = [];
  const gatewayChildren: ChildProcess[] = [];
  let redis: Pick<RedisServerHandle, 'url' | 'pid' | 'port' | 'stop'> | undefined;
  let redisCluster: RedisClusterHandle | undefined;
  let gateway: GatewayHandle | undefined;

  const workerConfig = (w: TestWorkerOptions) => loadConfig({}, { ...env, ...w.env, ROLLBOX_DATA_DIR: path.join(rootDir, w.nodeId), ROLLBOX_NODE_ID: w.nodeId });

  const stop = async () => {
    for (const child of [...children, ...gatewayChildren]) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await gateway?.stop();
    for (const w of workers) await w.stop({ destroySandboxes: true });
    // Workers that were spawned (and maybe killed) left containers behind: a worker
    // started on the same data dir reconciles them away, which is what production does.
    // One cleanup per node id (a test may have restarted a worker several times), with its last env.
    const spawned = new Map(children.map((child) => [(child as ChildProcess & { nodeId: string }).nodeId, child]));
    for (const child of spawned.values()) {
      const { nodeId, workerEnv } = child as ChildProcess & { nodeId: string; workerEnv?: Record<string, string> };
      // With the worker's own env (its layer store, its gateway: its lazy layers' gate ends too).
      const cleanup = await startWorkerRole(workerConfig({ nodeId, ...(workerEnv ? { env: workerEnv } : {}) }), redis!.url, logger).catch(() => undefined);
      await cleanup?.stop({ destroySandboxes: true });
    }
    await redis?.stop();
    await fs.rm(rootDir, { recursive: true, force: true });
  };

  try {
    if (options.redisCluster) {
      redisCluster = await startRedisCluster({ dataDir: path.join(rootDir, 'redis') });
      redis = { url: redisCluster.url, pid: 0, port: 0, stop: redisCluster.stop };
    } else {
      redis = await startRedisServer({ dataDir: path.join(rootDir, 'redis'), persist: true });
    }
    await ensureBaseLayer(config, redis.url);
    gateway = await startGatewayRole(config, redis.url, logger);
    // Worker hosts relay agent sandboxes (network.gateway) to this gateway.
    Object.assign(env, { ROLLBOX_SANDBOX_GATEWAY_URL: options.env?.ROLLBOX_SANDBOX_GATEWAY_URL ?? gateway.url });
    const cluster: TestCluster = {
      url: gateway.url,
      redisUrl: redis.url,
      redisPid: () => redis!.pid,
      ...(redisCluster ? { redisCluster } : {}),
      rootDir,
      config,
      token: (tenant, scopes, ttlSeconds = 600) => createTokenIssuer(config.jwt).issue({ tenant, scopes, ttlSeconds }),
      workerConfig,
      async addWorker(w) {
        const handle = await startWorkerRole(workerConfig(w), redis!.url, logger);
        workers.push(handle);
        return handle;
      },
      async spawnWorker(w) {
        const command = [process.execPath, path.join(REPO_ROOT, 'bin/rollbox.js'), 'worker', '--data-dir', path.join(rootDir, w.nodeId), '--node-id', w.nodeId, ...(w.destroyOnExit ? ['--destroy-on-exit'] : [])];
        const inNetns = w.netns ? ['nsenter', `--net=/run/netns/${w.netns}`, '--'] : [];
        const [file, ...args] = [...inNetns, ...command];
        const child = spawn(file!, args, {
          env: { ...process.env, ...env, REDIS_URL: redis!.url, ROLLBOX_LOG_LEVEL: 'warn', ...w.env },
          stdio: ['ignore', 'inherit', 'inherit'],
        });
        Object.assign(child, { nodeId: w.nodeId, workerEnv: w.env });
        children.push(child);
        return child;
      },
      async spawnGateway(g) {
        const child = spawn(process.execPath, [...(g.nodeArgs ?? []), path.join(REPO_ROOT, 'bin/rollbox.js'), 'gateway', '--data-dir', path.join(rootDir, g.name)], {
          env: { ...process.env, ...env, REDIS_URL: redis!.url, ROLLBOX_LOG_LEVEL: 'info', ...g.env },
          stdio: ['ignore', 'inherit', 'pipe'],
        });
        gatewayChildren.push(child);
        // Its log (stderr) says where it listens; the rest of it is drained unread.
        let out = '';
        const onLog = (d: Buffer) => void (out += d.toString());
        child.stderr!.on('data', onLog);
        const url = await waitFor(`gateway ${g.name} listening`, async () => {
          if (child.exitCode !== null) throw new Error(`gateway ${g.name} exited ${child.exitCode} before listening`);
          return /"url":"(http:\/\/[^"]+)".*"msg":"gateway listening"/.exec(out)?.[1];
        }, 60_000);
        child.stderr!.off('data', onLog).resume();
        out = '';
        return { child, url };
      },
      async stopGateway() {
        await gateway?.stop();
        gateway = undefined;
      },
      async startGateway() {
        const port = new URL(cluster.url).port;
        gateway = await startGatewayRole(loadConfig({}, { ...env, ROLLBOX_DATA_DIR: path.join(rootDir, 'gateway'), ROLLBOX_PORT: port }), redis!.url, logger);
      },
      async restartRedis() {
        if (redisCluster) throw new Error('restartRedis: this stack runs on a Redis Cluster (kill a node instead)');
        const port = redis!.port;
        await redis!.stop();
        redis = await startRedisServer({ dataDir: path.join(rootDir, 'redis'), persist: true, port });
      },
      stop,
    };
    for (const w of options.workers ?? []) await cluster.addWorker(w);
    return cluster;
  } catch (err) {
    await stop();
    throw err;
  }
}

export interface ApiResponse<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

/** Plain HTTP against the gateway, as a trainer would call it. */
export async function api<T = any>(cluster: Pick<TestCluster, 'url'>, token: string | undefined, method: string, urlPath: string, body?: unknown, headers: Record<string, string> = {}): Promise<ApiResponse<T>> {
  const response = await fetch(`${cluster.url}${urlPath}`, {
    method,
    headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
    body: body === undefined ? undefined : typeof body === 'string' || body instanceof Uint8Array ? (body as BodyInit) : JSON.stringify(body),
  });
  const text = await response.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: response.status, body: parsed as T, headers: response.headers };
}

/** Until `count` worker hosts heartbeat healthy (the token needs `admin`). */
export async function nodesUp(c: Pick<TestCluster, 'url'>, token: string, count: number): Promise<void> {
  await waitFor(`${count} nodes`, async () => (await api(c, token, 'GET', '/v1/nodes')).body.nodes?.filter((n: { healthy: boolean }) => n.healthy).length >= count, 30_000);
}

/** A worker host as its own process (`spawnWorker`), once its heartbeat says ready since it started (a restart's, not its predecessor's). */
export async function spawnReadyWorker(cluster: TestCluster, options: SpawnedWorkerOptions): Promise<ChildProcess> {
  const startedAfterMs = Date.now();
  const child = await cluster.spawnWorker(options);
  const admin = await cluster.token('ops', ['admin']);
  await waitFor(
    `${options.nodeId} ready`,
    async () => (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes.some((n) => n.nodeId === options.nodeId && n.ready !== false && n.healthy && n.atMs >= startedAfterMs),
    60_000,
  );
  return child;
}

/** A worker host's env for a host under memory pressure: its heartbeat looks fine, its admission refuses every create. */
/**
 * For a cluster whose tests restart a worker host and expect its sandboxes adopted: a restart
 * under CI load can take longer than TEST_ENV's lost time, and a janitor would fail them.
 */
export const RESTART_TOLERANT_ENV = { ROLLBOX_NODE_LOST_AFTER_MS: '15000' };

export const REFUSING_NODE_ENV = { ROLLBOX_NODE_HOST_RESERVE_MIB: String(1 << 30) };

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined | false>, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

import fs from 'node:fs';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NodeHeartbeat, Pool, Scope } from '../src/api/index.ts';
import { connectRedis } from '../src/redis/index.ts';
import { PoolRegistry } from '../src/registry/index.ts';
import { loadConfig } from '../src/config/index.ts';
import { startGatewayRole, type GatewayHandle, type WorkerHandle } from '../src/roles/index.ts';
import { api, RESTART_TOLERANT_ENV, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

/** Warm pools against a real cluster: claims bind everything of the create, refill, races, restarts, deletes. */
const NODE = 'node-pool1';
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete'];

let cluster: TestCluster;
let worker: WorkerHandle;
let admin: string;
let user: string;

beforeAll(async () => {
  cluster = await startTestCluster({ env: RESTART_TOLERANT_ENV });
  worker = await cluster.addWorker({ nodeId: NODE });
  admin = await cluster.token('ops', ['admin']);
  user = await cluster.token('trainer', SCOPES);
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
}, 60_000);

const putPool = (name: string, body: object) => api<Pool>(cluster, admin, 'PUT', `/v1/pools/${name}`, body);
const poolOf = async (name: string) => (await api<Pool>(cluster, admin, 'GET', `/v1/pools/${name}`)).body;
/** Ready sandboxes of the pool on the node, from a heartbeat written after `sinceMs`. */
const readyOn = async (name: string, sinceMs = 0) => {
  const nodes = (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes;
  const me = nodes.find((n) => n.nodeId === NODE && n.healthy && n.atMs > sinceMs);
  return me ? (me.pools?.[name]?.ready ?? 0) : -1;
};
const waitReady = (name: string, n: number) => {
  const since = Date.now();
  return waitFor(`${n} ready in pool ${name}`, async () => (await readyOn(name, since)) === n && (await readyIds(name)).length === n, 30_000);
};
const create = (body: object, token = user) => api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64, diskMiB: 64 }, ...body });
const sh = async (id: string, cmd: string) => (await api(cluster, user, 'POST', `/v1/sandboxes/${id}/exec`, { cmd })).body as { exitCode: number; stdout: string; stderr: string };
const remove = (id: string) => api(cluster, user, 'DELETE', `/v1/sandboxes/${id}`);
const readyIds = async (name: string) => {
  const redis = connectRedis(cluster.redisUrl);
  const pools = new PoolRegistry(redis);
  const record = await pools.get(name);
  const ids = record ? await pools.ready(record, NODE) : [];
  await redis.quit();
  return ids;
};

describe('pool API', () => {
  it('needs admin and a valid body', async () => {
    expect((await api(cluster, user, 'PUT', '/v1/pools/p', { size: 1 })).status).toBe(403);
    expect((await putPool('Bad_Name', { size: 1 })).status).toBe(400);
    expect((await putPool('p', { size: -1 })).status).toBe(400);
    expect((await putPool('p', { size: 1, image: { base: 'no-such-layer' } })).status).toBe(404);
    expect((await api(cluster, admin, 'GET', '/v1/pools/none')).status).toBe(404);
    expect((await api(cluster, admin, 'DELETE', '/v1/pools/none')).status).toBe(404);
  });

  it('is kept only by the worker hosts of its host pool', async () => {
    expect((await putPool('elsewhere', { size: 1, diskMiB: 64, hostPool: 'cloud' })).body.hostPool).toBe('cloud');
    // A heartbeat of this (local) host after a few pool ticks: it keeps nothing of it.
    const since = Date.now() + 1500;
    await waitFor('a later heartbeat', async () => (await readyOn('elsewhere', since)) !== -1);
    expect((await readyOn('elsewhere', since))).toBe(0);
    expect((await poolOf('elsewhere')).status).toMatchObject({ target: 0, ready: 0, starting: 0, hosts: [] });
    expect((await api(cluster, admin, 'DELETE', '/v1/pools/elsewhere')).status).toBe(204);
  });
});

describe('a warm pool', () => {
  it('fills to its size, and a matching create takes a ready sandbox with everything of the request bound to it', async () => {
    const put = await putPool('small', { size: 2, diskMiB: 64, resources: { cpuMillis: 500, memoryMiB: 32, pids: 64 } });
    expect(put.status, JSON.stringify(put.body)).toBe(200);
    expect(put.body.version).toMatch(/^[0-9a-f]{16}$/);
    await waitReady('small', 2);
    const offered = await readyIds('small');
    expect(offered).toHaveLength(2);

    const askedAt = new Date();
    const created = await create({
      resources: { memoryMiB: 96, cpuMillis: 250, diskMiB: 64, pids: 128 },
      env: { TASK: 'claimed' },
      workdir: '/tmp',
      labels: { run: 'r1' },
      job: 'job-pool',
      ttlSeconds: 120,
      hiddenPaths: ['/etc/passwd'],
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const s = created.body;
    expect(s.pool).toBe('small');
    expect(offered).toContain(s.id);
    // Started before it was asked for: the claim bound a ready sandbox, it did not fall back to a cold start.
    const state = JSON.parse(fs.readFileSync(path.join(cluster.rootDir, NODE, 'worker', 'runc', `rb-${s.id}`, 'state.json'), 'utf8'));
    expect(Date.parse(state.created)).toBeLessThan(askedAt.getTime());
    expect(s.spec.labels).toEqual({ run: 'r1' });
    expect(Date.parse(s.expiresAt) - Date.parse(s.startedAt)).toBe(120_000);
    const inside = await sh(s.id, 'echo "$TASK"; pwd; cat /etc/passwd | wc -c; ip -o link | grep -vc " lo:"; ps -o comm | tail -n +2');
    const [env, cwd, passwdBytes, interfaces, ...processes] = inside.stdout.trim().split('\n');
    expect(env).toBe('claimed');
    expect(cwd).toBe('/tmp');
    expect(passwdBytes!.trim()).toBe('0');
    expect(interfaces).toBe('0'); // no interface but loopback
    // Nothing but the init (and its exec slot's keeper) and this command's own processes.
    expect(processes.filter((p) => !['sh', 'ps', 'tail', 'exe'].includes(p))).toEqual(processes.filter((p) => p === 'init'));
    expect(processes).toContain('init');
    // The limits the create asked for, on the host's cgroups.
    const cgroup = path.join('/sys/fs/cgroup/memory/rollbox', NODE, `rb-${s.id}`);
    expect(Number(fs.readFileSync(path.join(cgroup, 'memory.limit_in_bytes'), 'utf8'))).toBe(96 * 1024 * 1024);
    expect(fs.readFileSync(path.join('/sys/fs/cgroup/pids/rollbox', NODE, `rb-${s.id}`, 'pids.max'), 'utf8').trim()).toBe('128');
    expect(fs.readFileSync(path.join('/sys/fs/cgroup/cpu/rollbox', NODE, `rb-${s.id}`, 'cpu.cfs_quota_us'), 'utf8').trim()).toBe('25000');
    // A latency sandbox runs nothing under SCHED_IDLE (the refill started it so).
    expect((await sh(s.id, 'cat /proc/1/sched | grep "^policy"')).stdout).toMatch(/policy\s+:\s+0/);

    // A create that asks for a network gets it bound at the claim.
    const networked = await create({ network: { mode: 'allowlist', allow: [{ cidr: '10.251.99.2/32' }] } });
    expect(networked.status, JSON.stringify(networked.body)).toBe(201);
    expect(networked.body.pool).toBe('small');
    expect((await sh(networked.body.id, 'ip -o link | grep -c eth0; cat /etc/resolv.conf')).stdout).toMatch(/^1\nnameserver 10\.200\./);

    // A request the pool cannot serve (another disk size) is a cold create, not an error.
    const cold = await create({ resources: { memoryMiB: 64, diskMiB: 128 } });
    expect(cold.status).toBe(201);
    expect(cold.body.pool).toBeUndefined();

    // Back to its size; the pool's status counts the claims.
    await waitReady('small', 2);
    const status = await poolOf('small');
    expect(status.status).toMatchObject({ target: 2, ready: 2, claimsPerMinute: 2 });
    expect(status.status.hosts).toEqual([{ nodeId: NODE, ready: 2, starting: 0 }]);
    for (const id of [s.id, networked.body.id, cold.body.id]) expect((await remove(id)).status).toBe(200);
  }, 120_000);

  it('hands the last ready sandbox to one of two gateways racing for it; the other starts cold', async () => {
    expect((await putPool('race', { size: 1, diskMiB: 64, resources: { memoryMiB: 40 } })).status).toBe(200);
    await waitReady('race', 1);
    const second: GatewayHandle = await startGatewayRole(loadConfig({}, { ...process.env, ROLLBOX_PORT: '0', ROLLBOX_LOG_LEVEL: 'silent', ROLLBOX_LAYER_STORE: path.join(cluster.rootDir, 'layers'), ROLLBOX_JWT_SECRET_FILE: path.join(cluster.rootDir, 'jwt-secret'), ROLLBOX_DATA_DIR: path.join(cluster.rootDir, 'gw2') }), cluster.redisUrl, pino({ level: 'silent' }));
    try {
      // Both claim within a few milliseconds; the pool's next sandbox takes a runc start.
      const body = { resources: { memoryMiB: 40, diskMiB: 64 } };
      const [a, b] = await Promise.all([create(body), api(second, user, 'POST', '/v1/sandboxes', body)]);
      expect([a.status, b.status]).toEqual([201, 201]);
      expect(a.body.id).not.toBe(b.body.id);
      expect([a.body.pool, b.body.pool].filter(Boolean)).toEqual(['race']);
      for (const id of [a.body.id, b.body.id]) expect((await remove(id)).status).toBe(200);
    } finally {
      await second.stop();
    }
    expect((await poolOf('race')).status.missesPerMinute).toBe(1);
    expect((await api(cluster, admin, 'DELETE', '/v1/pools/race')).status).toBe(204);
  }, 60_000);

  it('keeps its ready sandboxes across a worker restart, replaces them when the pool changes, and removes them when it is deleted', async () => {
    await waitReady('small', 2);
    const before = await readyIds('small');
    await worker.stop({ destroySandboxes: false });
    worker = await cluster.addWorker({ nodeId: NODE });
    // Adopted, not made again.
    expect(await readyIds('small')).toEqual(before);
    await waitReady('small', 2);
    const claimed = await create({});
    expect(claimed.body.pool).toBe('small');
    expect((await sh(claimed.body.id, 'echo ok')).stdout).toBe('ok\n');
    expect((await remove(claimed.body.id)).status).toBe(200);

    // A ready sandbox whose init dies (killed from the host) is never handed out; another takes its place.
    const [victim] = await readyIds('small');
    const { init_process_pid: pid } = JSON.parse(fs.readFileSync(path.join(cluster.rootDir, NODE, 'worker', 'runc', `rb-${victim}`, 'state.json'), 'utf8'));
    process.kill(pid, 'SIGKILL');
    await waitFor('the dead one replaced', async () => {
      const ids = await readyIds('small');
      return ids.length === 2 && !ids.includes(victim!);
    }, 30_000);

    // A new image or limits: a new version, and none of the old sandboxes is handed out.
    const oldIds = new Set(await readyIds('small'));
    const changed = await putPool('small', { size: 2, diskMiB: 64, resources: { cpuMillis: 500, memoryMiB: 48, pids: 64 } });
    await waitFor('the new version ready', async () => (await readyIds('small')).length === 2 && (await readyOn('small')) === 2, 30_000);
    expect((await readyIds('small')).some((id) => oldIds.has(id))).toBe(false);
    expect((await poolOf('small')).version).toBe(changed.body.version);

    expect((await api(cluster, admin, 'DELETE', '/v1/pools/small')).status).toBe(204);
    await waitFor('the ready sandboxes gone', async () => {
      const nodes = (await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes')).body.nodes;
      const me = nodes.find((n) => n.nodeId === NODE);
      return me?.sandboxes === 0 && !me.pools;
    }, 30_000);
    expect(fs.readdirSync(path.join(cluster.rootDir, NODE, 'worker', 'runc')).filter((d) => d.startsWith('rb-'))).toEqual([]);
    const redis = connectRedis(cluster.redisUrl);
    expect(await redis.keys('rb:{pool:*')).toEqual([]);
    await redis.quit();
  }, 120_000);
});

import fs from 'node:fs';
import path from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch, Scope } from '../src/api/index.ts';
import { RolloutKeyStore } from '../src/iam/index.ts';
import { ModelCallLog } from '../src/model-gateway/index.ts';
import { LuaScript, connectRedis } from '../src/redis/index.ts';
import { REFUSING_NODE_ENV, api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { allBatchResults } from './support/batches.ts';
import { hostTraces } from './support/host.ts';
import { ScriptedUpstream } from './support/model-upstream.ts';
import { layerTar, ociLayout } from './support/oci.ts';
import { pulled } from './support/pulls.ts';
import { startTestRegistry, type TestRegistry } from './support/registry.ts';
import { tarOf } from './support/tar.ts';

/**
 * The whole stack (gateway, worker hosts, BullMQ, every Lua script) on a real Redis
 * Cluster: 3 primaries with a replica each, started by the test on loopback ports. The
 * traffic is what users send; the last check is that every script of the project ran on
 * the cluster (each one a cluster node caches once it ran there), so a script whose keys
 * span slots cannot hide.
 */
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot', 'sandbox:policy', 'batch:submit', 'layer:write', 'layer:read', 'burst:admin', 'cluster:read'];
const REPO_ROOT = path.resolve(import.meta.dirname, '..');

let cluster: TestCluster;
let registry: TestRegistry;
let upstream: ScriptedUpstream;
let token: string;
let admin: string;

beforeAll(async () => {
  registry = await startTestRegistry();
  upstream = await ScriptedUpstream.start({ script: [{ text: 'On the cluster.' }] });
  cluster = await startTestCluster({
    redisCluster: true,
    workers: [{ nodeId: 'rcs-a', env: { ROLLBOX_SWAP_FILE_MIB: '64' } }, { nodeId: 'rcs-full', env: REFUSING_NODE_ENV }],
    env: {
      ROLLBOX_BURST_PROVIDER: 'local',
      ROLLBOX_BURST_TICK_MS: '200',
      ROLLBOX_LAYER_GC_GRACE_MS: '500',
      ROLLBOX_LAYER_GC_INTERVAL_MS: '300',
      ROLLBOX_REGISTRY_INSECURE: registry.host,
      ROLLBOX_REGISTRY_INTERNAL: registry.host,
      ROLLBOX_BATCH_SLOTS: '4',
      ROLLBOX_MODEL_LEASE_MS: '1000',
    },
  });
  token = await cluster.token('cluster-tenant', SCOPES);
  admin = await cluster.token('ops', ['admin']);
}, 120_000);

afterAll(async () => {
  await cluster?.stop();
  await registry?.stop();
  await upstream?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
});

const create = async (body: object = {}, headers: Record<string, string> = {}) => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ...body }, headers);
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body as { id: string; node: string; state: string };
};
const exec = (id: string, body: object) => api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, body);


/** Every Lua script of the project (src/**\/lua/*.lua) by name. */
function projectScripts(): Map<string, LuaScript> {
  const found = new Map<string, LuaScript>();
  const walk = (dir: string) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) walk(full);
      else if (entry.name.endsWith('.lua') && path.basename(dir) === 'lua') found.set(entry.name.slice(0, -'.lua'.length), new LuaScript(path.dirname(dir), entry.name.slice(0, -'.lua'.length)));
    }
  };
  walk(path.join(REPO_ROOT, 'src'));
  return found;
}

describe('rollbox on a Redis Cluster', () => {
  it('creates, runs, pauses, snapshots, pools, pulls, batches and deletes with every script on one slot', async () => {
    // Creates spread over the nodes; the refusing node's creates are placed again (reassign).
    const first = await create({}, { 'idempotency-key': 'cluster-create-1' });
    const again = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } }, { 'idempotency-key': 'cluster-create-1' });
    expect(again.body.id).toBe(first.id);
    const spread = await Promise.all(Array.from({ length: 11 }, () => create()));
    expect(new Set([first, ...spread].map((s) => s.node))).toEqual(new Set(['rcs-a']));

    // Exec: buffered, replayed by commandId, streamed, background; the command log.
    expect((await exec(first.id, { cmd: 'echo hello > /root/f; cat /root/f', commandId: 'c1' })).body.stdout).toBe('hello\n');
    const replay = await exec(first.id, { cmd: 'echo other', commandId: 'c1' });
    expect(replay.body).toMatchObject({ stdout: 'hello\n', replayed: true });
    const streamed = await fetch(`${cluster.url}/v1/sandboxes/${first.id}/exec`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'text/event-stream' }, body: JSON.stringify({ cmd: 'echo one; echo two' }) });
    expect(await streamed.text()).toMatch(/one[\s\S]*two[\s\S]*event: exit/);
    expect((await exec(first.id, { cmd: 'sleep 0.2', background: true, commandId: 'bg' })).status).toBe(202);
    await waitFor('the background command done', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${first.id}/commands/bg`)).body.state === 'done');
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${first.id}/commands`)).body.commands.map((c: { commandId: string }) => c.commandId)).toEqual(expect.arrayContaining(['c1', 'bg']));

    // Files, policy and TTL changes (compare-and-set scripts on the record).
    const put = await api(cluster, token, 'PUT', `/v1/sandboxes/${first.id}/files?path=/root/put`, new Uint8Array(Buffer.from('put\n')), { 'content-type': 'application/octet-stream' });
    expect(put.status, JSON.stringify(put.body)).toBeLessThan(300);
    expect((await exec(first.id, { cmd: 'cat /root/put' })).body.stdout).toBe('put\n');
    expect((await api(cluster, token, 'PATCH', `/v1/sandboxes/${first.id}/policy`, { network: { mode: 'none' } })).status).toBe(200);
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${first.id}/ttl`, { ttlSeconds: 3600 })).status).toBe(200);

    // Frozen, then paged out to swap (recorded on the paused record), resumed.
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${first.id}/pause`, { mode: 'freeze' })).body.state).toBe('paused');
    const swapped = await api(cluster, token, 'POST', `/v1/sandboxes/${first.id}/pause`, { mode: 'swap' });
    expect(swapped.body.swapped, JSON.stringify(swapped.body)).toBeDefined();
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${first.id}/resume`, {})).body.state).toBe('running');

    // Hibernate and wake (the hibernation layer is referenced, then released), a snapshot.
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${first.id}/pause`, { mode: 'hibernate' })).body.state).toBe('hibernated');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${first.id}/resume`, {})).body.state).toBe('running');
    expect((await exec(first.id, { cmd: 'cat /root/f' })).body.stdout).toBe('hello\n');
    const snapshot = await api(cluster, token, 'POST', `/v1/sandboxes/${first.id}/snapshot`, {});
    expect(snapshot.status, JSON.stringify(snapshot.body)).toBe(201);
    const fork = await api(cluster, token, 'POST', `/v1/sandboxes/${first.id}/fork`, { count: 2 }, { 'idempotency-key': 'cluster-fork-1' });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);

    // An uploaded layer, unnamed again: garbage collection forgets it.
    const tar = await tarOf([{ name: 'x.txt', content: 'x\n' }]);
    const uploaded = await api(cluster, token, 'POST', '/v1/layers?name=cluster-x', new Uint8Array(tar), { 'content-type': 'application/x-tar' });
    expect(uploaded.status).toBe(201);
    await api(cluster, token, 'DELETE', '/v1/layers/cluster-x');
    await waitFor('the layer forgotten', async () => (await api(cluster, token, 'GET', `/v1/layers/${uploaded.body.digest}`)).status === 404, 20_000);

    // A warm pool: filled (offers), claimed by a matching create.
    const pool = await api(cluster, admin, 'PUT', '/v1/pools/cluster-pool', { size: 1, diskMiB: 64, resources: { cpuMillis: 500, memoryMiB: 32, pids: 64 } });
    expect(pool.status, JSON.stringify(pool.body)).toBe(200);
    await waitFor('the pool ready', async () => (await api(cluster, admin, 'GET', '/v1/pools/cluster-pool')).body.status.ready >= 1, 30_000);
    const claimed = await create({ resources: { memoryMiB: 64, diskMiB: 64 } });
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${claimed.id}`)).body.pool).toBe('cluster-pool');
    expect((await api(cluster, admin, 'DELETE', '/v1/pools/cluster-pool')).status).toBe(204);

    // An image pulled from a registry on loopback.
    await registry.push(await ociLayout([{ layers: [await layerTar([{ name: 'hello.txt', content: 'hi\n' }])] }]), 't/cluster:1');
    expect((await pulled(cluster, token, { ref: `${registry.host}/t/cluster:1`, name: 'cluster-image' })).state).toBe('ready');

    // The burst controller leads through its lease (policy set, state written).
    expect((await api(cluster, token, 'PUT', '/v1/burst/policy', { divertAboveUtilization: 0.9, stopBelowUtilization: 0.5, dwellMs: 500, idleTerminateMs: 600_000, maxCloudHosts: 1, maxProvisionsPerMinute: 10, cloudHostSandboxes: 4 })).status).toBe(200);
    await waitFor('the controller state', async () => typeof (await api(cluster, token, 'GET', '/v1/burst')).body.diverting === 'boolean');

    // A batch on BullMQ: one task passes, one fails; exactly one line each.
    const submitted = await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks: [{ customId: 'ok', steps: [{ cmd: 'true' }] }, { customId: 'bad', steps: [{ cmd: 'exit 3' }] }] });
    expect(submitted.status, JSON.stringify(submitted.body)).toBe(201);
    const { lines, batch } = await allBatchResults(cluster, token, submitted.body.id);
    expect(batch.state).toBe('completed');
    expect(lines.map((l) => [l.customId, l.status]).sort()).toEqual([['bad', 'failed'], ['ok', 'succeeded']]);

    // A model call through a gateway SIGKILLed while it was upstream: the retry on the
    // stack's gateway takes it over (gate, join, renew, takeover, finish), recorded once.
    const trainer = await cluster.token('cluster-trainer', ['rollout:submit']);
    expect((await api(cluster, trainer, 'PUT', '/v1/jobs/job-cluster/model', { upstreams: [{ baseUrl: upstream.url }] })).status).toBe(200);
    const redis = connectRedis(cluster.redisUrl);
    try {
      const key = await new RolloutKeyStore(redis).issue({ tenant: 'cluster-trainer', rolloutId: 'ro-cluster', job: 'job-cluster', ttlSeconds: 600 });
      const doomedGateway = await cluster.spawnGateway({ name: 'gw-doomed' });
      const call = (base: string, headers: Record<string, string> = {}) => fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'cluster' }] }) });
      upstream.delayMs = 2000;
      const lost = call(doomedGateway.url).catch(() => undefined);
      await waitFor('the call upstream', async () => upstream.count('/v1/chat/completions') > 0);
      doomedGateway.child.kill('SIGKILL');
      await lost;
      const retried = await call(cluster.url, { 'x-stainless-retry-count': '1' });
      upstream.delayMs = 0;
      expect(retried.status).toBe(200);
      expect((await retried.json()).choices[0].message.content).toBe('On the cluster.');
      expect((await new ModelCallLog(redis).list('ro-cluster')).calls.map((c) => c.attempts.map((a) => a.outcome))).toEqual([['owner_lost', 'ok']]);
      // The trainer pauses its job: the next call waits in the job's line until it resumes.
      expect((await api(cluster, trainer, 'POST', '/v1/jobs/job-cluster/pause', {})).body.model.paused).toBe(true);
      const held = fetch(`${cluster.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'held' }] }) });
      await waitFor('the call held', async () => (await api(cluster, trainer, 'GET', '/v1/jobs/job-cluster/model')).body.hold.heldCalls === 1);
      expect((await api(cluster, trainer, 'POST', '/v1/jobs/job-cluster/resume', {})).body.model.paused).toBe(false);
      expect((await held).status).toBe(200);
    } finally {
      redis.disconnect();
    }

    // The console's signals (counters and maxima across gateways).
    expect((await api(cluster, token, 'GET', '/v1/cluster/console')).status).toBe(200);

    // A worker host that dies with a command running: the node is declared lost, its
    // sandboxes fail(lost) and the command ends result_unknown.
    const doomed = await cluster.spawnWorker({ nodeId: 'rcs-doomed', env: { ROLLBOX_COMMAND_GRACE_MS: '0' } });
    await waitFor('the doomed node up', async () => (await api(cluster, admin, 'GET', '/v1/nodes')).body.nodes?.some((n: { nodeId: string }) => n.nodeId === 'rcs-doomed'), 30_000);
    // Placement chooses between rcs-a and rcs-doomed: create until one lands there.
    const onDoomed = await waitFor('a sandbox on the doomed node', async () => {
      const s = await create();
      return s.node === 'rcs-doomed' ? s : undefined;
    }, 30_000);
    expect((await exec(onDoomed.id, { cmd: 'sleep 30', background: true, commandId: 'dies' })).status).toBe(202);
    await waitFor('the command running', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${onDoomed.id}/commands/dies`)).body.state === 'running');
    doomed.kill('SIGKILL');
    await waitFor('the command unknown', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${onDoomed.id}/commands/dies`)).body.state === 'unknown', 30_000);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${onDoomed.id}`)).body).toMatchObject({ state: 'failed', failureReason: 'lost' });

    // Deletes end every sandbox (terminal transitions: tenant, node and layer indexes after the record).
    const live = (await api<{ sandboxes: { id: string; state: string }[] }>(cluster, token, 'GET', '/v1/sandboxes?limit=100')).body.sandboxes.filter((s) => !['terminated', 'failed'].includes(s.state));
    expect(live.length).toBeGreaterThan(6);
    for (const s of live) expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${s.id}`)).status).toBeLessThan(300);
    await waitFor('every sandbox ended', async () => (await api<{ sandboxes: { state: string }[] }>(cluster, token, 'GET', '/v1/sandboxes?limit=100')).body.sandboxes.every((s) => ['terminated', 'failed'].includes(s.state)), 30_000);

    // The gateway stops (its burst controller lets its lease go), then: every script ran
    // on the cluster, as a node caches a script once it ran there.
    await cluster.stopGateway();
    const primaries = (await cluster.redisCluster!.nodes()).filter((n) => n.role === 'primary' && !n.failed);
    const connections = primaries.map((n) => new Redis({ host: '127.0.0.1', port: n.port, lazyConnect: false }));
    try {
      const notRun: string[] = [];
      for (const [name, script] of projectScripts()) {
        const cached = await Promise.all(connections.map(async (c) => ((await c.script('EXISTS', script.sha)) as number[])[0] === 1));
        if (!cached.some(Boolean)) notRun.push(name);
      }
      expect(notRun).toEqual([]);
    } finally {
      for (const c of connections) c.disconnect();
    }
  }, 300_000);
});

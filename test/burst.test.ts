import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { BurstPolicy, type Scope } from '../src/api/index.ts';
import { SimModel, simulate } from '../src/burst/sim/index.ts';
import { readTraceFile } from '../src/burst/trace/index.ts';
import { loadConfig } from '../src/config/index.ts';
import { startWorkerRole } from '../src/roles/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { tarOf } from './support/tar.ts';
import { gatesUnder, hostTraces } from './support/host.ts';
import pino from 'pino';

const REPO_ROOT = path.resolve(import.meta.dirname, '..');
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:read', 'sandbox:delete', 'sandbox:exec', 'layer:write', 'admin'];
/** A small local pool: two 256 MiB sandboxes put it at 0.5 utilization. */
const LOCAL_NODE = { nodeId: 'local-1', env: { ROLLBOX_NODE_MEMORY_MIB: '1024', ROLLBOX_NODE_CPU_MILLIS: '8000' } };
const POLICY = { divertAboveUtilization: 0.3, stopBelowUtilization: 0.2, dwellMs: 500, idleTerminateMs: 1500, maxCloudHosts: 1, maxProvisionsPerMinute: 10, cloudHostSandboxes: 4 };

let cluster: TestCluster;
let token: string;
let burstHostsDir: string;

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_BURST_PROVIDER: 'local', ROLLBOX_BURST_TICK_MS: '200' }, workers: [LOCAL_NODE] });
  token = await cluster.token('t', SCOPES);
  burstHostsDir = path.join(cluster.rootDir, 'gateway', 'burst-hosts');
});

afterAll(async () => {
  await cluster?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
  expect(gatesUnder(cluster.rootDir)).toEqual([]);
});


const create = (body: object) => api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ...body });
const burst = async () => (await api(cluster, token, 'GET', '/v1/burst')).body;
const poolOf = async (nodeId: string) => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes.find((n: { nodeId: string }) => n.nodeId === nodeId)?.pool;

async function readyCloudHost(): Promise<string> {
  return waitFor('a ready cloud host', async () => (await burst()).cloudHosts.find((h: { state: string }) => h.state === 'ready')?.id, 60_000);
}

/** The pid of one cloud host process, found by its exact node id (the test kills only that pid). */
function pidOfHost(hostId: string): number {
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let argv: string[];
    try {
      argv = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
    } catch {
      continue; // exited while the list was read
    }
    const at = argv.indexOf('--node-id');
    if (at >= 0 && argv[at + 1] === hostId && argv.includes('worker')) return Number(entry);
  }
  throw new Error(`no process for ${hostId}`);
}

describe('live cloud burst (local provider, real runc)', () => {
  it('diverts eligible creates to a synced cloud host past the threshold, keeps ineligible ones local, survives a vanished host, stops diverting and scales in', async () => {
    const extra = await api(cluster, token, 'POST', '/v1/layers?name=extra', new Uint8Array(await tarOf([{ name: 'extra.txt', content: 'x' }])), { 'content-type': 'application/x-tar' });
    expect(extra.status).toBe(201);
    expect((await api(cluster, token, 'PUT', '/v1/burst/policy', { divertAboveUtilization: 0.5, stopBelowUtilization: 0.6 })).status).toBe(400);
    const agent = await cluster.token('agent', ['sandbox:create', 'sandbox:read']);
    expect((await api(cluster, agent, 'PUT', '/v1/burst/policy', POLICY)).status).toBe(403);
    expect((await api(cluster, agent, 'GET', '/v1/burst')).status).toBe(200);
    expect(Object.keys((await api(cluster, undefined, 'GET', '/openapi.json')).body.paths)).toEqual(expect.arrayContaining(['/v1/burst', '/v1/burst/policy']));
    const stored = await api(cluster, token, 'PUT', '/v1/burst/policy', POLICY);
    expect(stored.status).toBe(200);
    expect(stored.body).toMatchObject({ ...POLICY, utilizationBasis: 'requested' });

    // Below the threshold everything stays local. (Before the worker joined, the empty
    // local pool counted as full, so diversion may be on until the dwell has passed.)
    await waitFor('no diversion while the local pool is idle', async () => !(await burst()).diverting, 30_000);
    // Utilization counts what sandboxes reserve: these reserve their whole limit.
    const first = await create({ resources: { memoryMiB: 256, requests: { memoryMiB: 256 } } });
    expect(first.body.node).toBe('local-1');
    const second = await create({ resources: { memoryMiB: 256, requests: { memoryMiB: 256 } } });
    expect(second.body.node).toBe('local-1');
    await waitFor('diversion to start', async () => (await burst()).diverting, 30_000);
    const status = await burst();
    expect(status.utilization).toBeGreaterThan(0.3);
    expect(status.syncedLayers).toHaveLength(1); // busybox only

    // Eligible, but no cloud host yet: it falls back to local and counts as diverted
    // demand, for which the controller provisions a host that syncs its layers, then
    // reports ready; the next eligible create lands there.
    const fellBack = await create({});
    expect(fellBack.body.node).toBe('local-1');
    const hostId = await readyCloudHost();
    const diverted = await create({});
    expect(diverted.status).toBe(201);
    expect(diverted.body.node).toBe(hostId);
    expect(await poolOf(hostId)).toBe('cloud');
    const onCloud = await api(cluster, token, 'POST', `/v1/sandboxes/${diverted.body.id}/exec`, { argv: ['echo', 'from the cloud'] });
    expect(onCloud.body.stdout).toBe('from the cloud\n');
    // The host synced the layer's metadata from the gateway (its data is read on demand into its own chunk cache).
    const busybox = status.syncedLayers[0].slice(7);
    const cached = fs.readdirSync(path.join(burstHostsDir, hostId, 'worker', 'lazy'));
    expect(cached).toEqual(expect.arrayContaining([`${busybox}.chunks`, `${busybox}.meta`, `${busybox}.data`]));
    expect(fs.existsSync(path.join(burstHostsDir, hostId, 'layers', 'sha256'))).toBe(false);

    // Ineligible: asked to stay local, or a layer outside the synced set.
    const stayLocal = await create({ placement: { stayLocal: true } });
    expect(stayLocal.body.node).toBe('local-1');
    const unsynced = await create({ image: { base: 'busybox', layers: ['extra'] } });
    expect(unsynced.body.node).toBe('local-1');
    const counts = (await burst()).counts;
    expect(counts.diverted).toBe(1);
    expect(counts.ineligible).toBe(2);
    expect(counts.byReason).toMatchObject({ stay_local: 1, layers_not_synced: 1, diverted: 2 });
    const metrics = await (await fetch(`${cluster.url}/metrics`)).text();
    expect(metrics).toContain('rollbox_burst_creates_total{target="cloud",reason="diverted"} 1');
    expect(metrics).toContain('rollbox_burst_fallbacks_total 1');

    // The cloud host vanishes: its sandbox ends failed(lost), new work goes to a new host.
    process.kill(pidOfHost(hostId), 'SIGKILL');
    await waitFor('failed(lost)', async () => {
      const s = (await api(cluster, token, 'GET', `/v1/sandboxes/${diverted.body.id}`)).body;
      return s.state === 'failed' && s.failureReason === 'lost';
    }, 30_000);
    await waitFor('the controller to forget the host', async () => !(await burst()).cloudHosts.some((h: { id: string }) => h.id === hostId), 30_000);
    // The fallen-back sandbox is still diverted demand: a new host comes up for it.
    const replacementHost = await readyCloudHost();
    expect(replacementHost).not.toBe(hostId);
    const replacement = await create({});
    expect(replacement.body.node).toBe(replacementHost);
    await reapKilledHost(hostId);

    // Local utilization falls below the lower threshold: after the dwell, diversion stops.
    for (const s of [first, second, fellBack, stayLocal, unsynced, replacement]) await api(cluster, token, 'DELETE', `/v1/sandboxes/${s.body.id}`);
    await waitFor('diversion to stop', async () => !(await burst()).diverting, 30_000);
    const after = await create({});
    expect(after.body.node).toBe('local-1');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${after.body.id}`);

    // The idle cloud host is drained, then terminated.
    await waitFor('idle cloud host terminated', async () => (await burst()).cloudHosts.length === 0 && !(await poolOf(replacement.body.node)), 60_000);
    expect((await burst()).counts.byReason.not_diverting).toBeGreaterThanOrEqual(3);

    // The recorder: every create above, as a trace the simulator replays.
    const traceFile = path.join(cluster.rootDir, 'recorded.jsonl');
    execFileSync(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), 'burst', 'record', '--out', traceFile, '--since', '10m'], { env: { ...process.env, REDIS_URL: cluster.redisUrl, ROLLBOX_LOG_LEVEL: 'silent' }, stdio: ['ignore', 'ignore', 'ignore'] });
    const { header, events } = readTraceFile(traceFile);
    expect(header).toMatchObject({ format: 'rollbox-burst-trace', source: 'recorder', syncedLayers: status.syncedLayers });
    expect(events).toHaveLength(8);
    expect(events[0]!.atMs).toBe(0);
    expect(events.filter((e) => e.stayLocal)).toHaveLength(1);
    expect(events.filter((e) => e.layers.length === 2 && e.layers[1] === extra.body.digest)).toHaveLength(1);
    expect(events.every((e) => e.lifetimeMs > 0 && e.memoryMiB >= 64)).toBe(true);
    const replay = simulate(events, BurstPolicy.parse(POLICY), SimModel.parse({ localNodes: 1, nodeMemoryMiB: 1024, cloudProvisioningDelayMs: 1000, cloudLayerSyncDelayMs: 500 }), new Set(header!.syncedLayers));
    expect(replay.creates).toBe(8);
  }, 180_000); // about 25 s alone; cloud hosts boot slower while other tests load the machine
});

/** A SIGKILLed worker leaves containers behind; a worker started on its data dir removes them. */
async function reapKilledHost(hostId: string): Promise<void> {
  const dataDir = path.join(burstHostsDir, hostId);
  // As the host itself was configured (its gateway: the gate of its lazy layers ends with it too).
  const hostEnv = { ROLLBOX_GATEWAY_URL: cluster.url, ROLLBOX_GATEWAY_TOKEN: await cluster.token('reaper', ['layer:host']) };
  const config = loadConfig({}, { ROLLBOX_DATA_DIR: dataDir, ROLLBOX_NODE_ID: hostId, ROLLBOX_POOL: 'reap', ROLLBOX_LAYER_STORE: path.join(dataDir, 'layers'), ROLLBOX_LOG_LEVEL: 'silent', ...hostEnv });
  const reaper = await startWorkerRole(config, cluster.redisUrl, pino({ level: 'silent' }));
  await reaper.stop({ destroySandboxes: true });
  expect(hostTraces(dataDir).containers).toEqual([]);
  expect(fs.existsSync(path.join(dataDir, 'worker', 'gate', 'gate.sock'))).toBe(false);
}

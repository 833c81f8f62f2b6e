import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { buildMemhold } from './support/memhold.ts';
import { startTargetNetns, type TargetNetns } from './support/target-netns.ts';

/**
 * Pause mode `swap` on this host's cgroup v1 memory controller: a sandbox holding 256 MiB
 * and a TCP connection to a namespace the test made is frozen and paged out to its worker's
 * swap file; the host gets the memory back (another sandbox is admitted into it and fills
 * it); resumed, the same process finds its memory (checksum), its open file and its
 * connection as they were. No room in swap (too full, or none) is a coded refusal with the
 * sandbox left as it was. The swap file goes with the worker.
 */
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin'];
const MIB = 1024 * 1024;
const HELD_MIB = 256;
const HOLD_PORT = 7213;
/** Capacity for one 320 MiB sandbox and a paged-out one, not two resident ones. */
const NODE_MEMORY_MIB = 520;
const SWAP_FILE_MIB = 400;

let cluster: TestCluster;
let target: TargetNetns;
let token: string;
let memhold: string;
let swapNode: Awaited<ReturnType<TestCluster['addWorker']>>;

beforeAll(async () => {
  target = await startTargetNetns({ subnet: 86, holdPort: HOLD_PORT, ports: [] });
  cluster = await startTestCluster({ env: { ROLLBOX_NET_STATIC_HOSTS: `allowed.name=${target.address}` } });
  swapNode = await cluster.addWorker({ nodeId: 'node-swap', env: { ROLLBOX_NODE_MEMORY_MIB: String(NODE_MEMORY_MIB), ROLLBOX_SWAP_FILE_MIB: String(SWAP_FILE_MIB) } });
  token = await cluster.token('swapper', SCOPES);
  memhold = buildMemhold(cluster.rootDir);
}, 120_000);
afterAll(async () => {
  const rootDir = cluster?.rootDir;
  await cluster?.stop();
  await target?.stop();
  // Nothing of the test's swap files is left enabled or on disk.
  if (rootDir) expect(readFileSync('/proc/swaps', 'utf8')).not.toContain(rootDir);
});

const exec = async (id: string, cmd: string) => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 60_000 });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body.stdout as string;
};
const memoryCgroup = (node: string, id: string, file: string) => `/sys/fs/cgroup/memory/rollbox/${node}/rb-${id}/${file}`;
const residentBytes = (node: string, id: string) => Number(readFileSync(memoryCgroup(node, id, 'memory.usage_in_bytes'), 'utf8'));
const freezerState = (node: string, id: string) => readFileSync(`/sys/fs/cgroup/freezer/rollbox/${node}/rb-${id}/freezer.state`, 'utf8').trim();
const swapFile = (node: string) => path.join(cluster.rootDir, node, 'worker', 'swapfile');
const swapEnabled = (file: string) => readFileSync('/proc/swaps', 'utf8').includes(file);

/** A sandbox running memhold over HELD_MIB MiB; answers its id and memhold's first checksum. */
async function holdingSandbox(body: object): Promise<{ id: string; node: string; checksum: string }> {
  const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 320, requests: { memoryMiB: 320 } }, ...body });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  const { id, node } = created.body;
  const upload = await api(cluster, token, 'PUT', `/v1/sandboxes/${id}/files?path=/root/memhold&mode=0755`, readFileSync(memhold), { 'content-type': 'application/octet-stream' });
  expect(upload.status, JSON.stringify(upload.body)).toBe(200);
  await exec(id, `/root/memhold ${HELD_MIB} /root/held.log </dev/null >/dev/null 2>&1 & echo $! > /root/memhold.pid`);
  await waitFor('memhold to fill its memory', async () => (await exec(id, 'cat /root/held.log')).length > 0, 60_000);
  return { id, node, checksum: (await exec(id, 'cat /root/held.log')).trim() };
}

/** memhold's checksums so far, after asking it for one more (through the file it keeps open). */
async function recheck(id: string, lines: number): Promise<string[]> {
  await exec(id, 'kill -USR1 $(cat /root/memhold.pid)');
  await waitFor('memhold to write its checksum again', async () => (await exec(id, 'cat /root/held.log')).trim().split('\n').length >= lines, 60_000);
  return (await exec(id, 'cat /root/held.log')).trim().split('\n');
}

describe('pause mode swap', () => {
  it('pages a paused job out to swap, lends the memory to another sandbox, and resumes the same processes, memory, files and connection', async () => {
    const a = await holdingSandbox({ job: 'swap-job', network: { mode: 'allowlist', allow: [{ host: 'allowed.name', ports: [HOLD_PORT] }] } });
    expect(a.node).toBe('node-swap');
    await exec(a.id, `(sleep 3600 | nc allowed.name ${HOLD_PORT} >/tmp/ticks 2>/dev/null) </dev/null >/dev/null 2>&1 & true`);
    await waitFor('ticks over the held connection', async () => Number(await exec(a.id, 'wc -l < /tmp/ticks')) > 2);
    const ncPid = (await exec(a.id, `pgrep -f "nc allowed.name ${HOLD_PORT}"`)).trim();
    const held = residentBytes(a.node, a.id);
    expect(held).toBeGreaterThan(HELD_MIB * MIB);

    // Two resident 320 MiB sandboxes do not fit the node.
    const refused = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 320, requests: { memoryMiB: 320 } } });
    expect(refused.status, JSON.stringify(refused.body)).toBe(503);

    const paused = await api(cluster, token, 'POST', '/v1/jobs/swap-job/pause', { mode: 'swap' });
    expect(paused.status, JSON.stringify(paused.body)).toBe(200);
    expect(paused.body.results).toMatchObject([{ id: a.id, outcome: 'done', state: 'paused' }]);
    expect(freezerState(a.node, a.id)).toBe('FROZEN');
    expect(swapEnabled(swapFile(a.node))).toBe(true);
    const resident = residentBytes(a.node, a.id);
    console.log(`host memory of the sandbox: ${(held / MIB).toFixed(1)} MiB running, ${(resident / MIB).toFixed(1)} MiB paged out`);
    expect(resident).toBeLessThanOrEqual(0.1 * HELD_MIB * MIB);
    const record = (await api(cluster, token, 'GET', `/v1/sandboxes/${a.id}`)).body;
    expect(record.state).toBe('paused');
    expect(record.swapped.swappedBytes).toBeGreaterThanOrEqual(HELD_MIB * MIB);
    expect(record.swapped.residentBytes).toBeLessThanOrEqual(0.1 * HELD_MIB * MIB);
    // Paged out already: asked again, nothing changes.
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${a.id}/pause`, { mode: 'swap' })).body.state).toBe('paused');

    // The memory it gave back is admitted to another sandbox, which fills it.
    await waitFor('the node to count the paged-out sandbox at what it holds', async () => {
      const node = (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes.find((n: { nodeId: string }) => n.nodeId === a.node);
      return node.used.memoryMiB <= 0.1 * HELD_MIB;
    });
    // The node reports it: in its heartbeat and in the gateway's metrics.
    const metric = async (name: string) => Number(new RegExp(`^${name}\\{node="${a.node}"[^}]*\\} (\\S+)$`, 'm').exec((await api(cluster, undefined, 'GET', '/metrics')).body)?.[1]);
    await waitFor('the node to report the swapped memory', async () => (await metric('rollbox_node_memory_swapped_bytes')) >= HELD_MIB * MIB);
    expect(await metric('rollbox_node_memory_given_back_bytes')).toBeGreaterThanOrEqual((320 - 0.1 * HELD_MIB) * MIB);
    expect(await metric('rollbox_node_memory_resident_bytes')).toBeLessThan(0.1 * HELD_MIB * MIB + 64 * MIB);
    const b = await holdingSandbox({});
    expect(residentBytes(b.node, b.id)).toBeGreaterThan(HELD_MIB * MIB);

    // No room left in swap for b: refused, coded, and b runs on untouched.
    const full = await api(cluster, token, 'POST', `/v1/sandboxes/${b.id}/pause`, { mode: 'swap' });
    expect(full.status, JSON.stringify(full.body)).toBe(503);
    expect(full.body.error.code).toBe('swap_unavailable');
    expect(full.body.error.message).toMatch(/too full/);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${b.id}`)).body.state).toBe('running');
    expect(freezerState(b.node, b.id)).toBe('THAWED');
    expect(await recheck(b.id, 2)).toEqual([b.checksum, b.checksum]);
    // Frozen first, then refused: it stays frozen and whole.
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${b.id}/pause`, { mode: 'freeze' })).body.state).toBe('paused');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${b.id}/pause`, { mode: 'swap' })).body.error.code).toBe('swap_unavailable');
    const frozen = (await api(cluster, token, 'GET', `/v1/sandboxes/${b.id}`)).body;
    expect(frozen.state).toBe('paused');
    expect(frozen.swapped).toBeUndefined();
    expect(freezerState(b.node, b.id)).toBe('FROZEN');
    expect(residentBytes(b.node, b.id)).toBeGreaterThan(HELD_MIB * MIB);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${b.id}`);

    const resumed = await api(cluster, token, 'POST', '/v1/jobs/swap-job/resume', {});
    expect(resumed.body.results).toMatchObject([{ id: a.id, outcome: 'done', state: 'running' }]);
    expect(residentBytes(a.node, a.id)).toBeGreaterThan(HELD_MIB * MIB);
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${a.id}`)).body.swapped).toBeUndefined();
    // The same memhold, its memory whole, writing through the descriptor it kept open.
    expect(await recheck(a.id, 2)).toEqual([a.checksum, a.checksum]);
    // The same nc, on the same connection, still receiving.
    expect((await exec(a.id, `pgrep -f "nc allowed.name ${HOLD_PORT}"`)).trim()).toBe(ncPid);
    const ticks = Number(await exec(a.id, 'wc -l < /tmp/ticks'));
    await waitFor('more ticks over the same connection', async () => Number(await exec(a.id, 'wc -l < /tmp/ticks')) > ticks + 2);
    expect(target.connections(HOLD_PORT)).toHaveLength(1);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${a.id}`);
  }, 240_000);

  it('pauses at its TTL in mode swap (E2B auto-pause), kept paused, then resumed whole', async () => {
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ttlSeconds: 2, onTtl: { action: 'pause', mode: 'swap', pausedTtlSeconds: 600 } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    await exec(id, 'echo kept > /root/file; sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /root/sleep.pid');
    await waitFor('the auto-pause', async () => (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body.state === 'paused', 30_000);
    const record = (await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body;
    expect(record.swapped, JSON.stringify(record)).toBeDefined();
    expect(Date.parse(record.expiresAt) - Date.now()).toBeGreaterThan(500_000);
    expect(freezerState(record.node, id)).toBe('FROZEN');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${id}/resume`, {})).body.state).toBe('running');
    expect(await exec(id, 'cat /root/file; kill -0 $(cat /root/sleep.pid) && echo alive')).toBe('kept\nalive\n');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  }, 60_000);

  it('removes the swap file with its worker, and refuses a swap pause on a host without swap space, the sandbox running on', async () => {
    const file = swapFile('node-swap');
    expect(swapEnabled(file)).toBe(true);
    await swapNode.stop({ destroySandboxes: true });
    expect(swapEnabled(file)).toBe(false);
    expect(existsSync(file)).toBe(false);

    await cluster.addWorker({ nodeId: 'node-noswap', env: { ROLLBOX_SWAP_FILE_MIB: '0' } });
    await waitFor('the node without swap', async () => (await api(cluster, token, 'GET', '/v1/nodes')).body.nodes?.some((n: { nodeId: string; healthy: boolean }) => n.nodeId === 'node-noswap' && n.healthy));
    const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } });
    expect(created.body.node).toBe('node-noswap');
    const id = created.body.id as string;
    await exec(id, 'echo kept > /root/file; sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /root/sleep.pid');
    const refused = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/pause`, { mode: 'swap' });
    expect(refused.status, JSON.stringify(refused.body)).toBe(503);
    expect(refused.body.error.code).toBe('swap_unavailable');
    expect((await api(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body.state).toBe('running');
    expect(freezerState('node-noswap', id)).toBe('THAWED');
    expect(await exec(id, 'cat /root/file; kill -0 $(cat /root/sleep.pid) && echo alive')).toBe('kept\nalive\n');
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
  }, 120_000);
});

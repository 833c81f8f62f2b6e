import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { launchChromium, type Chromium } from './support/cdp.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';

// The operator console (GET /ui/console) in a real headless Chromium over a real stack
// that carried traffic: creates, execs, a small batch, a warm pool claim and a forced
// burst to a local-provider cloud host. What the page shows is what the API and the
// metrics say, and text from sandboxes (labels) stays text.

const XSS = '<img src=x onerror=alert(1)>';
const SCREENSHOT = path.join(import.meta.dirname, 'artifacts', 'console-page.png');
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:read', 'sandbox:delete', 'sandbox:exec', 'batch:submit', 'admin'];
/** Two 256 MiB reservations put this node at 0.5 utilization, over the policy's 0.3. */
const LOCAL_NODE = { nodeId: 'console-local', env: { ROLLBOX_NODE_MEMORY_MIB: '1024', ROLLBOX_NODE_CPU_MILLIS: '8000' } };
const POLICY = { divertAboveUtilization: 0.3, stopBelowUtilization: 0.2, dwellMs: 500, idleTerminateMs: 600_000, maxCloudHosts: 1, maxProvisionsPerMinute: 10, cloudHostSandboxes: 4 };

let cluster: TestCluster;
let chromium: Chromium | undefined;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_BURST_PROVIDER: 'local', ROLLBOX_BURST_TICK_MS: '200', ROLLBOX_BATCH_SLOTS: '4' }, workers: [LOCAL_NODE] });
  token = await cluster.token('console-tenant', SCOPES);
}, 120_000);
afterAll(async () => {
  await chromium?.close();
  await cluster?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
});

const create = (body: object) => api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ...body });
const burst = async () => (await api(cluster, token, 'GET', '/v1/burst')).body;
/** A metric's value summed over its label sets (a fresh cluster: the gateway's counters are the cluster's). */
function metricSum(metrics: string, name: string): number {
  return metrics.split('\n').filter((line) => line.startsWith(`${name}{`) || line.startsWith(`${name} `)).reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
}

describe('the operator console', () => {
  it('shows the figures the API and the metrics give after real traffic, with text from sandboxes as text', async () => {
    expect((await api(cluster, token, 'PUT', '/v1/burst/policy', POLICY)).status).toBe(200);
    const pool = await api(cluster, token, 'PUT', '/v1/pools/console-pool', { size: 1, diskMiB: 64, resources: { cpuMillis: 500, memoryMiB: 32, pids: 64 } });
    expect(pool.status, JSON.stringify(pool.body)).toBe(200);
    await waitFor('no diversion while the local node is idle', async () => !(await burst()).diverting, 30_000);

    // Creates (one labelled with markup), execs, then a forced burst: two large reservations
    // push utilization over the threshold; the next create falls back and provisions a cloud host.
    const labelled = await create({ labels: { note: XSS } });
    expect(labelled.status, JSON.stringify(labelled.body)).toBe(201);
    for (const word of ['one', 'two', 'three']) expect((await api(cluster, token, 'POST', `/v1/sandboxes/${labelled.body.id}/exec`, { argv: ['echo', word] })).body.stdout).toBe(`${word}\n`);
    // A streamed exec counts as an exec too (read whole: its events end with the exit).
    const streamed = await fetch(`${cluster.url}/v1/sandboxes/${labelled.body.id}/exec`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'text/event-stream' }, body: JSON.stringify({ argv: ['echo', 'streamed'] }) });
    expect(await streamed.text()).toMatch(/event: exit/);
    for (let i = 0; i < 2; i++) expect((await create({ resources: { memoryMiB: 256, requests: { memoryMiB: 256 } } })).status).toBe(201);
    await waitFor('diversion to start', async () => (await burst()).diverting, 30_000);
    expect((await create({})).status).toBe(201);
    const hostId = await waitFor('a ready cloud host', async () => (await burst()).cloudHosts.find((h: { state: string }) => h.state === 'ready')?.id, 90_000);
    const diverted = await create({});
    expect(diverted.body.node).toBe(hostId);

    // A claim from the warm pool (its spec read like a create's), and a small batch.
    await waitFor('the pool ready', async () => (await api(cluster, token, 'GET', '/v1/pools/console-pool')).body.status?.ready === 1, 60_000);
    const claimed = await create({ placement: { stayLocal: true }, resources: { cpuMillis: 500, memoryMiB: 32, pids: 64, diskMiB: 64 } });
    expect(claimed.body.pool, JSON.stringify(claimed.body)).toBe('console-pool');
    const batch = await api(cluster, token, 'POST', '/v1/batches', { tasks: ['a', 'b', 'c'].map((customId) => ({ customId, steps: [{ cmd: customId === 'c' ? 'exit 3' : 'echo ok', timeoutMs: 20_000 }] })) });
    expect(batch.status, JSON.stringify(batch.body)).toBe(201);
    await waitFor('the batch to complete', async () => (await api(cluster, token, 'GET', `/v1/batches/${batch.body.id}`)).body.state === 'completed', 120_000);
    expect((await api(cluster, token, 'DELETE', `/v1/sandboxes/${diverted.body.id}`)).status).toBe(200);
    await waitFor('the pool refilled', async () => (await api(cluster, token, 'GET', '/v1/pools/console-pool')).body.status?.ready === 1, 60_000);

    chromium = await launchChromium();
    const page = await chromium.newPage({ width: 1280, height: 1600 });
    await page.navigate(`${cluster.url}/ui/console#token=${encodeURIComponent(token)}`);
    // Figures cover whole 10 s buckets: wait for a refresh whose window ends after the
    // traffic, and after the gateway's once-a-second write of what it counted.
    const quietSinceMs = Date.now();
    await page.waitFor('a refresh whose window holds the traffic', `(() => { const at = Number(document.body.dataset.atMs); return at > ${quietSinceMs + 2000} && Math.floor(at / 10000) * 10000 > ${quietSinceMs}; })()`, 40_000);
    expect(await page.evaluate('location.hash')).not.toContain('token');
    const shown = await page.evaluate(`(() => {
      const figures = {};
      for (const f of document.querySelectorAll('.figure[data-figure]')) figures[f.closest('section').id + ':' + f.dataset.figure] = f.dataset.value;
      return {
        figures,
        nodes: Object.fromEntries([...document.querySelectorAll('#nodes tr[data-node-id]')].map((r) => [r.dataset.nodeId, Number(r.dataset.sandboxes)])),
        pool: document.querySelector('#pools tr[data-pool="console-pool"] [data-col=ready]')?.textContent,
        memoryHeld: document.querySelector('#nodes tr[data-node-id="${LOCAL_NODE.nodeId}"] [data-col=memory-held]')?.textContent,
        cloudHosts: [...document.querySelectorAll('#burst tr[data-cloud-host]')].map((r) => r.dataset.cloudHost),
        labels: [...document.querySelectorAll('#recent td.small')].map((td) => [td.textContent, td.children.length]),
        charts: [...document.querySelectorAll('#signal-charts [data-chart]')].length,
        // Every chart's tick labels, and the burst meter's threshold labels: boxes that meet, and labels that repeat.
        overlaps: [...document.querySelectorAll('#signal-charts svg'), document.querySelector('#burst .meter')].flatMap((chart) => {
          const boxes = [...chart.querySelectorAll('text, .mark span')].map((t) => [t.textContent, t.getBoundingClientRect()]);
          return boxes.flatMap(([a, p], i) => boxes.slice(i + 1).filter(([, r]) => p.left < r.right && r.left < p.right && p.top < r.bottom && r.top < p.bottom).map(([b]) => a + ' x ' + b));
        }),
        repeatedTicks: [...document.querySelectorAll('#signal-charts svg')].flatMap((chart) => {
          const values = [...chart.querySelectorAll('text[text-anchor=end]')].map((t) => t.textContent);
          return values.filter((v, i) => values.indexOf(v) !== i);
        }),
        explanation: document.getElementById('capacity-explanation')?.textContent,
        text: document.querySelector('main').textContent,
      };
    })()`);
    const snapshot = (await api(cluster, token, 'GET', '/v1/cluster/console?windowSeconds=900&capacityWindowSeconds=300')).body;
    const metrics = await (await fetch(`${cluster.url}/metrics`)).text();
    const t = snapshot.signals.total;
    const figure = (key: string) => shown.figures[key] === 'null' ? null : Number(shown.figures[key]);

    // Counts: page = API = metrics.
    expect(figure('signals-section:admitted')).toBe(t.admitted);
    expect(t.admitted).toBe(metricSum(metrics, 'rollbox_sandbox_create_wait_seconds_count'));
    expect(figure('signals-section:execs')).toBe(t.execs);
    expect(t.execs).toBe(metricSum(metrics, 'rollbox_exec_duration_seconds_count'));
    expect(t.execs).toBe(3 + 1 + 3); // buffered, streamed, and the batch's steps
    for (const cause of ['quota', 'no_capacity', 'network']) expect(figure(`signals-section:refusals.${cause}`)).toBe(t.refusals[cause]);
    expect(figure('signals-section:ended')).toBe(t.ended);
    expect(figure('signals-section:taskSuccessShare')).toBe(t.taskSuccessShare);
    expect(t.taskSuccessShare).toBeCloseTo(2 / 3, 2);
    expect(metricSum(metrics, 'rollbox_batch_tasks_ended_total')).toBe(3);
    for (const key of ['waitP50Ms', 'waitP99Ms', 'execP50Ms', 'execP99Ms', 'residenceMedianMs', 'residenceMeanMs']) expect(figure(`signals-section:${key}`)).toBe(t[key]);
    // Burst: the forced diversion, its cloud host, the counts.
    expect(figure('burst-section:diverted')).toBe(snapshot.burst.counts.diverted);
    expect(snapshot.burst.counts.diverted).toBeGreaterThanOrEqual(2);
    expect(figure('burst-section:ineligible')).toBe(snapshot.burst.counts.ineligible);
    expect(shown.cloudHosts).toEqual([hostId]);
    // Nodes and the pool.
    expect(shown.nodes).toEqual(Object.fromEntries(snapshot.nodes.map((n: { nodeId: string; sandboxes: number }) => [n.nodeId, n.sandboxes])));
    expect(Object.keys(shown.nodes).sort()).toEqual([LOCAL_NODE.nodeId, hostId].sort());
    expect(shown.pool).toBe('1 / 1');
    // Its sandboxes' memory, in RAM, in swap and given back by swap pauses (none here).
    expect(shown.memoryHeld).toMatch(/ in RAM.* in swap · 0 MiB given back \(0 swapped\)/);
    // Capacity: the same inputs, stated with them.
    expect(figure('capacity-section:liveSandboxes')).toBe(snapshot.capacity.liveSandboxes);
    expect(figure('capacity-section:residentPool')).toBe(snapshot.capacity.residentPool);
    expect(figure('capacity-section:nodesNeeded')).toBe(snapshot.capacity.nodesNeeded);
    expect(metrics).toContain(`rollbox_capacity_resident_pool ${snapshot.capacity.residentPool}`);
    expect(shown.explanation).toBe(snapshot.capacity.explanation);
    expect(shown.charts).toBe(7);
    expect(shown.overlaps).toEqual([]);
    expect(shown.repeatedTicks).toEqual([]);

    // The markup label is text: its cell has no element children, no image exists, no dialog opened.
    expect(shown.labels).toContainEqual([`note=${XSS}`, 0]);
    expect(await page.evaluate(`document.querySelectorAll('img').length`)).toBe(0);
    expect(shown.text).not.toMatch(/undefined|NaN/);
    expect(page.dialogs).toEqual([]);
    expect(page.exceptions).toEqual([]);
    const png = await page.screenshot(SCREENSHOT);
    expect(png.subarray(1, 4).toString()).toBe('PNG');

    // The simulator from the page: its figures and its sweep shown as an image.
    await page.click('#sim-run');
    await page.waitFor('the simulation', `!!document.querySelector('#sim-figures')`, 120_000);
    expect(await page.evaluate(`document.querySelector('#sim-chart').src.startsWith('data:image/svg+xml')`)).toBe(true);
    expect(page.exceptions).toEqual([]);
    for (const s of (await api(cluster, token, 'GET', '/v1/sandboxes')).body.sandboxes ?? []) await api(cluster, token, 'DELETE', `/v1/sandboxes/${s.id}`);
    await api(cluster, token, 'DELETE', '/v1/pools/console-pool');
  }, 420_000);
});

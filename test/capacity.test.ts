import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CapacityReport } from '../src/api/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { hostTraces } from './support/host.ts';

// The capacity estimate against a load whose answer is known: creates arrive at a fixed
// rate and each sandbox lives a fixed time, so Little's law says the live count; the
// estimate (from the shared signals alone) must be within 10% of the count measured.

const INTERVAL_MS = 500; // 2 creates a second
const LIFETIME_MS = 4000;
const RUN_MS = 36_000;

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'cap-node' }] });
  token = await cluster.token('cap-tenant', ['sandbox:create', 'sandbox:delete', 'sandbox:read', 'cluster:read']);
}, 120_000);
afterAll(async () => {
  await cluster?.stop();
  expect(hostTraces(cluster.rootDir)).toEqual({ mounts: [], loops: [], containers: [] });
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const liveNow = async () => (await api(cluster, token, 'GET', '/v1/cluster/capacity?windowSeconds=10')).body.liveSandboxes as number;

describe('capacity from Little\'s law', () => {
  it('estimates the concurrency of a fixed-rate, fixed-lifetime load within 10% of the live count', async () => {
    const startedMs = Date.now();
    const lives: Promise<void>[] = [];
    const failures: string[] = [];
    const life = async () => {
      const created = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 32 }, ttlSeconds: 120 });
      if (created.status !== 201) return void failures.push(`create ${created.status}`);
      await sleep(LIFETIME_MS);
      const deleted = await api(cluster, token, 'DELETE', `/v1/sandboxes/${created.body.id}`);
      if (deleted.status >= 300) failures.push(`delete ${deleted.status}`);
    };
    const samples: { atMs: number; live: number }[] = [];
    const sampler = (async () => {
      while (Date.now() - startedMs < RUN_MS) {
        samples.push({ atMs: Date.now(), live: await liveNow() });
        await sleep(250);
      }
    })();
    for (let i = 0; Date.now() - startedMs < RUN_MS; i++) {
      lives.push(life());
      await sleep(Math.max(0, startedMs + (i + 1) * INTERVAL_MS - Date.now()));
    }
    const endMs = Date.now();
    await sampler;
    await Promise.all(lives);
    await sleep(1500); // the gateway's signals flush (every second)
    expect(failures).toEqual([]);

    // A 20 s window of whole buckets ending at the load's end: it starts after the first
    // sandboxes' lifetimes, when arrivals and departures balance.
    const report: CapacityReport = (await api(cluster, token, 'GET', `/v1/cluster/capacity?windowSeconds=20&endMs=${endMs}&safePerNode=10&headroom=1.2`)).body;
    expect(report.window.seconds).toBe(20);
    expect(report.window.fromMs).toBeGreaterThan(startedMs + LIFETIME_MS);
    const inWindow = samples.filter((s) => s.atMs >= report.window.fromMs && s.atMs < report.window.toMs);
    expect(inWindow.length).toBeGreaterThan(20);
    const liveMean = inWindow.reduce((sum, s) => sum + s.live, 0) / inWindow.length;
    process.stderr.write(`capacity: lambda ${report.admissionRatePerSecond}/s, W ${report.meanResidenceSeconds} s, L ${report.estimatedConcurrency}, live mean ${liveMean.toFixed(2)} (${inWindow.length} samples)\n`);
    expect(Math.abs(report.admissionRatePerSecond - 1000 / INTERVAL_MS) / (1000 / INTERVAL_MS)).toBeLessThan(0.1);
    expect(report.meanResidenceSeconds!).toBeGreaterThanOrEqual(LIFETIME_MS / 1000);
    expect(report.meanResidenceSeconds!).toBeLessThan(LIFETIME_MS / 1000 + 1.5);
    expect(Math.abs(report.estimatedConcurrency! - liveMean) / liveMean).toBeLessThan(0.1);
    // With the operator's figures: ceil(L x 1.2 / 10) nodes, and the +1/-1 node rows.
    expect(report.safePerNode).toMatchObject({ sandboxes: 10, source: 'query' });
    expect(report.nodesNeeded).toBe(Math.ceil((report.estimatedConcurrency! * 1.2) / 10 - 1e-9));
    expect(report.scenarios.map((s) => s.nodes)).toEqual([0, 1, 2]);
    expect(report.explanation).toContain(`mean residence ${report.meanResidenceSeconds} s`);
    // The console's snapshot carries the same capacity figures and the latest creates; its page is strict.
    const snapshot = (await api(cluster, token, 'GET', `/v1/cluster/console?capacityWindowSeconds=20`)).body;
    expect(snapshot.capacity.window.seconds).toBe(20);
    expect(snapshot.signals.total.admitted).toBeGreaterThanOrEqual(report.admitted);
    expect(snapshot.recent.length).toBe(20);
    expect(snapshot.recent[0].tenant).toBe('cap-tenant');
    const page = await fetch(`${cluster.url}/ui/console`);
    expect(page.headers.get('content-security-policy')).toMatch(/script-src 'sha256-[^']+'/);
    expect(await page.text()).toContain('<title>rollbox console</title>');
    const metrics = await (await fetch(`${cluster.url}/metrics`)).text();
    expect(metrics).toMatch(/rollbox_sandbox_create_wait_seconds_count \d+/);
    expect(metrics).toContain('rollbox_capacity_estimated_concurrency');
    // Scope: cluster:read (or admin).
    const agent = await cluster.token('agent', ['sandbox:create']);
    expect((await api(cluster, agent, 'GET', '/v1/cluster/capacity')).status).toBe(403);
    expect((await api(cluster, token, 'GET', '/v1/cluster/capacity?windowSeconds=5')).status).toBe(400);
  }, 120_000);
});

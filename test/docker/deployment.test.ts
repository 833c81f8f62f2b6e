import { mkdtemp, mkdir, readFile, rm, symlink, copyFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../support/registry.ts';
import { startTargetNetns, type TargetNetns } from '../support/target-netns.ts';
import { COMPOSE, DOCKER, ensureDockerd, holdForwarding, hostState, leftOver, progress, run, type Dockerd, type HostState } from './host.ts';

/**
 * The Docker deployment as an operator runs it (issue 29): Debian's Docker engine, a base
 * image built here from Debian's packages, rollbox's image on it, wrangler-free-docker/
 * compose.yaml with two workers, a token from the gateway container, the base layer
 * uploaded, creates on both workers, an exec, an allowlist sandbox reaching a listener in a
 * network namespace this test made, then `down -v` and nothing left on the host.
 */
const REPO = path.resolve(import.meta.dirname, '../..');
const COMPOSE_FILE = path.join(REPO, 'wrangler-free-docker/compose.yaml');
const BASE_IMAGE = 'rollbox-base:bookworm';
const ROLLBOX_IMAGE = 'rollbox:docker-test';
const REDIS_IMAGE = 'rollbox-redis-test:7';
const TARGET_PORT = 7201;
const project = `rbxdocker${process.pid}`;

let workDir: string;
let dockerd: Dockerd | undefined;
let before: HostState;
let iptablesBefore: { v4: string; v6: string };
let composeEnv: NodeJS.ProcessEnv;
let gatewayUrl: string;
let token: string;
let target: TargetNetns | undefined;
let composeUp = false;
let releaseForwarding: (() => Promise<void>) | undefined;
let containersBefore: string[] = [];
let volumesBefore: string[] = [];
let networksBefore: string[] = [];
const timingsMs: Record<string, number> = {};
const figures: Record<string, number> = {};
/** The deployment's worker hosts (their cgroups are looked for afterwards). */
let nodeIds: string[] = [];

async function timed<T>(phase: string, work: () => Promise<T>): Promise<T> {
  const t0 = Date.now();
  progress(`${phase}...`);
  const value = await work();
  timingsMs[phase] = Date.now() - t0;
  progress(`${phase}: ${(timingsMs[phase]! / 1000).toFixed(1)} s`);
  return value;
}

const compose = (...args: string[]) => run(COMPOSE, ['-p', project, '-f', COMPOSE_FILE, ...args], { env: composeEnv });
const list = async (...args: string[]) => (await run(DOCKER, args)).split('\n').filter(Boolean);

async function api(method: string, route: string, body?: unknown, contentType = 'application/json'): Promise<{ status: number; body: any }> {
  const response = await fetch(`${gatewayUrl}${route}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': contentType }) },
    body: body === undefined ? undefined : Buffer.isBuffer(body) ? new Uint8Array(body) : JSON.stringify(body),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await response.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: response.status, body: parsed };
}

async function until<T>(what: string, probe: () => Promise<T | undefined | false>, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** A busybox rootfs as a tar, from the host's static busybox (what `rollbox up` registers itself). */
async function busyboxTar(): Promise<Buffer> {
  const root = path.join(workDir, 'busybox-root');
  await mkdir(path.join(root, 'bin'), { recursive: true });
  for (const d of ['etc', 'tmp', 'proc', 'sys', 'dev', 'root']) await mkdir(path.join(root, d));
  await copyFile('/bin/busybox', path.join(root, 'bin/busybox'));
  for (const applet of (await run('/bin/busybox', ['--list'])).split('\n').filter((a) => a && a !== 'busybox')) await symlink('busybox', path.join(root, 'bin', applet));
  await run('tar', ['-C', root, '-cf', path.join(workDir, 'busybox.tar'), '.']);
  return readFile(path.join(workDir, 'busybox.tar'));
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/**
 * A figure, not a check: `true` run in a sandbox through the gateway, against the floor of
 * `docker exec <worker> true` (Docker's own exec into the worker's container) in the same run.
 */
async function measureExec(sandboxId: string): Promise<void> {
  const worker = (await compose('ps', '-q', 'worker')).split('\n')[0]!.trim();
  const rounds = 7;
  const floorMs: number[] = [];
  const rollboxMs: number[] = [];
  for (let i = 0; i < rounds; i++) {
    let t0 = performance.now();
    await run(DOCKER, ['exec', worker, 'true']);
    floorMs.push(performance.now() - t0);
    t0 = performance.now();
    const r = await api('POST', `/v1/sandboxes/${sandboxId}/exec`, { argv: ['true'], timeoutMs: 20_000 });
    rollboxMs.push(performance.now() - t0);
    expect(r.status).toBe(200);
  }
  figures.execMedianMs = Math.round(median(rollboxMs) * 10) / 10;
  figures.dockerExecFloorMedianMs = Math.round(median(floorMs) * 10) / 10;
  figures.execToDockerExecRatio = Math.round((median(rollboxMs) / median(floorMs)) * 100) / 100;
  progress(`exec of true through the gateway: median ${figures.execMedianMs} ms; floor docker exec into a worker: ${figures.dockerExecFloorMedianMs} ms (ratio ${figures.execToDockerExecRatio})`);
}

beforeAll(async () => {
  workDir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-docker-'));
  iptablesBefore = { v4: await run('iptables-save', []), v6: await run('ip6tables-save', []) };
  before = await hostState();
  dockerd = await timed('start the Docker engine', () => ensureDockerd(path.join(workDir, 'dockerd.log'), iptablesBefore));
  containersBefore = await list('ps', '-aq');
  volumesBefore = await list('volume', 'ls', '-q');
  networksBefore = await list('network', 'ls', '-q');

  const haveBase = await run(DOCKER, ['image', 'inspect', BASE_IMAGE]).then(() => true, () => false);
  if (haveBase && !process.env.ROLLBOX_DOCKER_REBUILD_BASE) progress(`base image ${BASE_IMAGE} already built (ROLLBOX_DOCKER_REBUILD_BASE=1 builds it again)`);
  else await timed('build the base image from Debian packages', () => run('sh', [path.join(REPO, 'scripts/docker-base-image.sh'), BASE_IMAGE], { env: { ...process.env, DOCKER } }));
  // --force-rm: a failed step's container goes too.
  await timed('build the Redis stand-in image', () => run(DOCKER, ['build', '-q', '--force-rm', '--network', 'host', '--build-arg', `BASE_IMAGE=${BASE_IMAGE}`, '-t', REDIS_IMAGE, '-f', path.join(REPO, 'test/docker/redis.Dockerfile'), path.join(REPO, 'test/docker')]));
  await timed('build the rollbox image', () => run(DOCKER, ['build', '-q', '--force-rm', '--network', 'host', '--build-arg', `BASE_IMAGE=${BASE_IMAGE}`, '-t', ROLLBOX_IMAGE, '-f', COMPOSE_FILE.replace('compose.yaml', 'Dockerfile'), REPO]));

  const port = await freePort();
  gatewayUrl = `http://127.0.0.1:${port}`;
  composeEnv = { ...process.env, ROLLBOX_IMAGE, REDIS_IMAGE, ROLLBOX_PORT: String(port), BASE_IMAGE };
  composeUp = true;
  await timed('compose up --scale worker=2', () => compose('up', '-d', '--no-build', '--scale', 'worker=2'));
  await timed('gateway ready', () => until('the gateway\'s /readyz', async () => (await fetch(`${gatewayUrl}/readyz`, { signal: AbortSignal.timeout(5_000) })).status === 200, 120_000));
  token = (await compose('exec', '-T', 'gateway', 'node', 'bin/rollbox.js', 'token', 'issue', '--tenant', 'docker-test', '--scopes', 'admin', '--ttl', '1h')).trim();
  progress('token issued in the gateway container');
}, 40 * 60_000);

afterAll(async () => {
  try {
    if (composeUp) await timed('compose down -v', () => compose('down', '-v', '--remove-orphans'));
    if (dockerd) {
      expect(await list('ps', '-aq')).toEqual(containersBefore);
      expect(await list('volume', 'ls', '-q')).toEqual(volumesBefore);
      expect(await list('network', 'ls', '-q')).toEqual(networksBefore);
    }
  } finally {
    await target?.stop();
    await releaseForwarding?.();
    await dockerd?.stop();
    await rm(workDir, { recursive: true, force: true });
  }
  const after = await hostState();
  progress(`left over: ${JSON.stringify(leftOver(before, after, nodeIds))}`);
  expect(nodeIds).toHaveLength(2);
  expect(leftOver(before, after, nodeIds)).toEqual({ links: [], netns: [], mounts: [], loops: [], cgroups: [] });
  if (dockerd?.ours) {
    expect(after.iptables).toBe(before.iptables);
    expect(after.ip6tables).toBe(before.ip6tables);
  }
  console.log(JSON.stringify({ test: 'docker-deployment', timingsMs, ...figures }));
}, 10 * 60_000);

describe('the Docker deployment (wrangler-free-docker)', () => {
  let nodes: { nodeId: string; healthy: boolean; network?: { allowlist: string; detail?: string } }[] = [];

  it('starts two worker hosts that pass their start checks and network self-tests', async () => {
    nodes = await timed('both workers report, network self-tests passing', () =>
      until('two worker hosts with a passing network self-test', async () => {
        const r = await api('GET', '/v1/nodes');
        const ready = (r.body.nodes ?? r.body) as typeof nodes;
        return Array.isArray(ready) && ready.filter((n) => n.healthy && n.network?.allowlist === 'ok').length === 2 ? ready : undefined;
      }, 180_000),
    );
    nodeIds = nodes.map((n) => n.nodeId);
    const logs = await compose('logs', '--no-color', 'worker');
    expect(logs).not.toContain('start check');
  });

  it('takes the base layer, creates on both workers and runs a command', async () => {
    const upload = await timed('upload the busybox base layer', async () => api('POST', '/v1/layers?name=busybox', await busyboxTar(), 'application/x-tar'));
    expect(upload.status, JSON.stringify(upload.body)).toBeLessThan(300);
    const seen = new Map<string, string>();
    await timed('creates until both workers have one', async () => {
      for (let i = 0; i < 16 && seen.size < 2; i++) {
        const created = await api('POST', '/v1/sandboxes', { resources: { memoryMiB: 64 } });
        expect(created.status, JSON.stringify(created.body)).toBe(201);
        const node = String(created.body.node);
        if (!seen.has(node)) seen.set(node, created.body.id);
        else expect((await api('DELETE', `/v1/sandboxes/${created.body.id}`)).status).toBeLessThan(300);
      }
    });
    expect([...seen.keys()].sort()).toEqual(nodes.map((n) => n.nodeId).sort());
    await measureExec([...seen.values()][0]!);
    for (const id of seen.values()) {
      const exec = await api('POST', `/v1/sandboxes/${id}/exec`, { cmd: 'echo hello from $(hostname)', timeoutMs: 20_000 });
      expect(exec.status, JSON.stringify(exec.body)).toBe(200);
      expect(exec.body.exitCode).toBe(0);
      expect(exec.body.stdout).toContain('hello from');
      expect((await api('DELETE', `/v1/sandboxes/${id}`)).status).toBeLessThan(300);
    }
  });

  it('gives an allowlist sandbox the listener in a namespace of the test, and nothing else', async () => {
    releaseForwarding = await holdForwarding();
    target = await startTargetNetns({ subnet: 91, holdPort: TARGET_PORT + 1, ports: [TARGET_PORT, TARGET_PORT + 2] });
    const created = await api('POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, network: { mode: 'allowlist', allow: [{ cidr: `${target.address}/32`, ports: [TARGET_PORT] }] } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const probe = async (port: number) => (await api('POST', `/v1/sandboxes/${created.body.id}/exec`, { cmd: `echo | nc -w 3 ${target!.address} ${port}`, timeoutMs: 20_000 })).body.stdout as string;
    expect(await probe(TARGET_PORT)).toContain(`hello ${TARGET_PORT}`);
    expect(await probe(TARGET_PORT + 2)).not.toContain('hello');
    expect(target.connections(TARGET_PORT + 2)).toEqual([]);
    // Masqueraded twice over: the target sees a worker container's address, never a sandbox's veth.
    expect(target.connections(TARGET_PORT)[0]?.from).not.toMatch(/^10\.200\./);
    expect((await api('DELETE', `/v1/sandboxes/${created.body.id}`)).status).toBeLessThan(300);
  });
});

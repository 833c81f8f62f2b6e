/**
 * A gateway and a worker host that start before their Redis (issue 29, point 1): they say
 * which Redis they wait for and why, the gateway answers /healthz and /readyz meanwhile, and
 * both serve once Redis appears. A wrong password is a clear exit, not a wait.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startRedisServer, type RedisServerHandle } from '../src/redis/index.ts';
import { waitFor } from './support/cluster.ts';

const REPO_ROOT = path.resolve(import.meta.dirname, '..');
/** Rollbox processes stop first (a process stopping without its Redis would wait for it), then servers and dirs. */
const stops: (() => Promise<void>)[] = [];
const cleanups: (() => Promise<void>)[] = [];
afterAll(async () => {
  for (const c of [...stops, ...cleanups.reverse()]) await c().catch(() => undefined);
}, 120_000);

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const srv = net.createServer().listen(0, '127.0.0.1', () => {
      const address = srv.address();
      srv.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

function rollbox(args: string[], env: Record<string, string>): { child: ChildProcess; log: () => string } {
  const child = spawn(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), ...args], { env: { ...process.env, ROLLBOX_LOG_LEVEL: 'info', ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
  let out = '';
  child.stderr!.on('data', (d: Buffer) => void (out += d.toString()));
  stops.push(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    }
  });
  return { child, log: () => out };
}

async function tempDir(): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-startup-'));
  cleanups.push(() => fs.rm(dir, { recursive: true, force: true }));
  return dir;
}

describe('starting before Redis', () => {
  it('a gateway logs the Redis it waits for within 5 s, answers /readyz 503 with the reason, and serves once Redis is up', async () => {
    const dir = await tempDir();
    const redisPort = await freePort();
    const env = { REDIS_URL: `redis://127.0.0.1:${redisPort}`, ROLLBOX_PORT: '0', ROLLBOX_DATA_DIR: dir, ROLLBOX_LAYER_STORE: path.join(dir, 'layers') };
    const gateway = rollbox(['gateway', '--data-dir', dir], env);
    const url = await waitFor('the gateway to answer while it starts', async () => /"url":"(http:\/\/[^"]+)".*answering \/healthz/.exec(gateway.log())?.[1], 20_000);
    const startedMs = Date.now();
    await waitFor('the wait logged', async () => /waiting for Redis/.test(gateway.log()) && /"reason":"refused"/.test(gateway.log()), 5000);
    expect(Date.now() - startedMs).toBeLessThan(5000);
    expect(gateway.log()).toContain(`127.0.0.1:${redisPort}`);
    const healthz = await fetch(`${url}/healthz`);
    expect(healthz.status).toBe(200);
    const readyz = await fetch(`${url}/readyz`);
    expect(readyz.status).toBe(503);
    expect((await readyz.json()) as object).toMatchObject({ ready: false, reason: expect.stringMatching(/waiting for Redis \(refused/) });
    const route = await fetch(`${url}/v1/sandboxes`);
    expect(route.status).toBe(503);
    expect(((await route.json()) as { error: { code: string } }).error.code).toBe('unavailable');

    // A worker host started now waits too, and says so.
    const worker = rollbox(['worker', '--data-dir', path.join(dir, 'worker-host'), '--node-id', 'startup-w1', '--destroy-on-exit'], env);
    await waitFor('the worker to log its wait', async () => /worker host startup-w1: waiting for Redis/.test(worker.log()), 30_000);

    const redis: RedisServerHandle = await startRedisServer({ dataDir: path.join(dir, 'redis'), port: redisPort, persist: false });
    cleanups.push(() => redis.stop());
    await waitFor('the gateway ready', async () => (await fetch(`${url}/readyz`).catch(() => undefined))?.status === 200, 30_000);
    expect(gateway.log()).toMatch(/gateway: Redis answers/);
    await waitFor('the worker started', async () => /worker host started/.test(worker.log()), 30_000);
  });

  it('exits with a clear message when Redis refuses the password', async () => {
    const dir = await tempDir();
    const port = await freePort();
    const redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--requirepass', 'right-one', '--dir', dir], { stdio: 'ignore' });
    cleanups.push(async () => {
      redis.kill('SIGTERM');
      await new Promise((r) => redis.once('exit', r));
    });
    await waitFor('redis-server listening', async () => new Promise<boolean>((resolve) => net.connect(port, '127.0.0.1').once('connect', function (this: net.Socket) { this.destroy(); resolve(true); }).once('error', () => resolve(false))));
    const gateway = rollbox(['gateway', '--data-dir', dir], { REDIS_URL: `redis://:wrong-one@127.0.0.1:${port}`, ROLLBOX_PORT: '0', ROLLBOX_DATA_DIR: dir });
    const code = await new Promise<number | null>((resolve) => gateway.child.once('exit', resolve));
    expect(code).not.toBe(0);
    expect(gateway.log()).toMatch(/refused this process: .*(WRONGPASS|invalid)/);
    expect(gateway.log()).not.toContain('wrong-one');
  });
});

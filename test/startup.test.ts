/**
 * A gateway and a worker host that start before their Redis (issue 29, point 1): they say
 * which Redis they wait for and why, the gateway answers /healthz and /readyz meanwhile, and
 * both serve once Redis appears. A wrong password is a clear exit, not a wait.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
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

  it('says a Redis in protected mode refuses it, answers /readyz 503 with that reason, and serves once the Redis lets it in', async () => {
    // A Redis reached over a network (not loopback), without a password and without a
    // config file, refuses every command in protected mode: one in a namespace of the test's own.
    const dir = await tempDir();
    const tag = randomBytes(3).toString('hex');
    const ns = `rbtest-pm-${tag}`;
    const hostEnd = `rbpm${tag}h`;
    const net29 = '10.253.29';
    execFileSync('ip', ['netns', 'add', ns]);
    cleanups.push(async () => void execFileSync('ip', ['netns', 'del', ns]));
    execFileSync('ip', ['link', 'add', hostEnd, 'type', 'veth', 'peer', 'name', 'uplink', 'netns', ns]);
    cleanups.push(async () => void execFileSync('sh', ['-c', `ip link del ${hostEnd} 2>/dev/null || true`]));
    execFileSync('ip', ['-batch', '-'], { input: `addr add ${net29}.1/30 dev ${hostEnd}\nlink set ${hostEnd} up\n` });
    execFileSync('ip', ['-n', ns, '-batch', '-'], { input: `link set lo up\naddr add ${net29}.2/30 dev uplink\nlink set uplink up\n` });
    const port = 6390;
    const redis = spawn('ip', ['netns', 'exec', ns, 'redis-server', '--port', String(port), '--protected-mode', 'yes', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
    cleanups.push(async () => {
      redis.kill('SIGTERM');
      await new Promise((r) => redis.once('exit', r));
    });
    const redisCli = (...args: string[]) => execFileSync('ip', ['netns', 'exec', ns, 'redis-cli', '-p', String(port), ...args], { encoding: 'utf8' }).trim();
    await waitFor('redis-server in its namespace', async () => { try { return redisCli('ping') === 'PONG'; } catch { return false; } });

    const env = { REDIS_URL: `redis://${net29}.2:${port}`, ROLLBOX_PORT: '0', ROLLBOX_DATA_DIR: dir, ROLLBOX_LAYER_STORE: path.join(dir, 'layers') };
    const gateway = rollbox(['gateway', '--data-dir', dir], env);
    const url = await waitFor('the gateway to answer while it starts', async () => /"url":"(http:\/\/[^"]+)".*answering \/healthz/.exec(gateway.log())?.[1], 20_000);
    await waitFor('the protected-mode refusal logged', async () => /waiting for Redis/.test(gateway.log()) && /"reason":"protected_mode"/.test(gateway.log()), 10_000);
    const readyz = await fetch(`${url}/readyz`);
    expect(readyz.status).toBe(503);
    expect((await readyz.json()) as object).toMatchObject({ ready: false, reason: expect.stringMatching(/protected.mode/) });

    // The operator turns protected mode off (from inside, where it listens on loopback).
    expect(redisCli('config', 'set', 'protected-mode', 'no')).toBe('OK');
    await waitFor('the gateway ready', async () => (await fetch(`${url}/readyz`).catch(() => undefined))?.status === 200, 30_000);
    expect(gateway.log()).toMatch(/gateway: Redis answers/);
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

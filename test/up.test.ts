import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { hostTraces } from './support/host.ts';

const REPO_ROOT = path.resolve(import.meta.dirname, '..');
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-up-'));
afterAll(() => fs.rmSync(dataDir, { recursive: true, force: true }));

describe('rollbox up (npm start)', () => {
  it('prints a URL, a token and a working curl line; SIGTERM leaves nothing behind, also with a command still running', async () => {
    // Its own process group, like a terminal's foreground job: Ctrl-C signals all of it.
    const child = spawn(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), 'up', '--port', '0', '--data-dir', dataDir], {
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ROLLBOX_LOG_LEVEL: 'warn' },
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    let stdout = '';
    child.stdout!.on('data', (b: Buffer) => (stdout += b.toString()));
    const deadline = Date.now() + 60_000;
    while (!stdout.includes('Ctrl-C stops everything') && Date.now() < deadline && child.exitCode === null) await new Promise((r) => setTimeout(r, 100));
    expect(stdout).toContain('rollbox is up');

    const curl = stdout.split('\n').find((l) => l.trim().startsWith('curl') && l.includes('/v1/sandboxes') && !l.includes('/exec'))!;
    const url = /(http:\/\/[^ ]+\/v1\/sandboxes)/.exec(curl)![1]!;
    const token = /Bearer ([^']+)'/.exec(curl)![1]!;
    const created = await fetch(url, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: '{}' });
    expect(created.status).toBe(201);
    const sandbox = (await created.json()) as { id: string; state: string };
    expect(sandbox.state).toBe('running');
    const run = await fetch(`${url}/${sandbox.id}/exec`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: '{"cmd":"echo hello"}' });
    expect(((await run.json()) as { stdout: string }).stdout).toBe('hello\n');
    // The batch page it points to, with the token in the fragment (never sent to the server).
    const page = stdout.split('\n').find((l) => l.includes('/ui#token='))!.trim();
    expect(page.split('#token=')[1]).toBe(token);
    expect(await (await fetch(page.split('#')[0]!)).text()).toContain('rollbox batches');
    // A command still running (for ten minutes) must not hold the shutdown up.
    const background = await fetch(`${url}/${sandbox.id}/exec`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: '{"cmd":"sleep 600","background":true}' });
    expect(background.status).toBe(202);

    // SIGTERM to rollbox alone (a service manager's stop), so that nothing but rollbox's own
    // shutdown ends the command; Ctrl-C would signal the whole group, runc exec included.
    process.kill(child.pid!, 'SIGTERM');
    expect(await exited).toBe(0);
    expect(hostTraces(dataDir)).toEqual({ mounts: [], loops: [], containers: [] });
    const redisLeft = fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p)).some((p) => {
      try {
        return fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(dataDir);
      } catch {
        return false;
      }
    });
    expect(redisLeft).toBe(false);
  });
});

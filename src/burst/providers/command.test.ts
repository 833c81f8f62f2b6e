import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CommandProvider } from './command.ts';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-cmdprov-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function script(name: string, body: string): Promise<string> {
  const file = path.join(dir, name);
  await writeFile(file, `#!/bin/sh\n${body}\n`);
  await chmod(file, 0o755);
  return file;
}

const request = { hostId: 'cloud-1', pool: 'cloud', gatewayUrl: 'http://127.0.0.1:1', token: 'tok', redisUrl: 'redis://127.0.0.1:2', layers: ['sha256:aa'], slots: 4 };

describe('CommandProvider', () => {
  it('passes a JSON object on stdin and reads JSON from stdout, as a Slurm Resume/SuspendProgram would', async () => {
    const seen = path.join(dir, 'seen');
    const provider = new CommandProvider({
      provision: `${await script('provision', `cat > ${seen}.provision; echo '{"id":"vm-42"}'`)}`,
      terminate: `${await script('terminate', `cat > ${seen}.terminate`)}`,
      list: `${await script('list', `echo '{"hosts":[{"id":"vm-42","state":"running","startedAtMs":5}]}'`)}`,
      timeoutMs: 5000,
    });
    expect(await provider.provision(request)).toEqual({ id: 'vm-42' });
    expect(JSON.parse(await readFile(`${seen}.provision`, 'utf8'))).toEqual({ action: 'provision', ...request });
    await provider.terminate('vm-42');
    expect(JSON.parse(await readFile(`${seen}.terminate`, 'utf8'))).toEqual({ action: 'terminate', id: 'vm-42' });
    expect(await provider.list()).toEqual([{ id: 'vm-42', state: 'running', startedAtMs: 5 }]);
  });

  it('names the action in errors: non-zero exit with stderr, bad JSON, wrong shape, missing program, timeout', async () => {
    const failing = await script('failing', `echo 'quota exceeded in region' >&2; exit 3`);
    const chatty = await script('chatty', `echo 'starting VM...'`);
    const wrong = await script('wrong', `echo '{"vm":"x"}'`);
    const slow = await script('slow', `sleep 30`);
    const base = { provision: failing, terminate: failing, list: chatty, timeoutMs: 5000 };
    await expect(new CommandProvider(base).provision(request)).rejects.toThrow(/burst provision command failed \(exit 3\): quota exceeded in region/);
    await expect(new CommandProvider(base).list()).rejects.toThrow(/burst list command printed no JSON/);
    await expect(new CommandProvider({ ...base, provision: wrong }).provision(request)).rejects.toThrow(/unexpected JSON: id/);
    await expect(new CommandProvider({ ...base, terminate: path.join(dir, 'absent') }).terminate('x')).rejects.toThrow(/burst terminate command failed \(exit 127\)/);
    const started = Date.now();
    await expect(new CommandProvider({ ...base, provision: slow, timeoutMs: 300 }).provision(request)).rejects.toMatchObject({ code: 'timeout' });
    expect(Date.now() - started).toBeLessThan(10_000);
  });
});

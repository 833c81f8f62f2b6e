import { spawn } from 'node:child_process';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const REPO = path.resolve(import.meta.dirname, '..');

/**
 * The Python client's pytest suite (clients/python/tests), run by `npm test`: it starts its
 * own real stack (test/support/python-stack.ts) and stops it, so this file only runs it and
 * reports. Debian's python3 (bootstrap installs pytest and httpx for it).
 */
describe('python client', () => {
  it('passes its pytest suite against a real stack', async () => {
    const child = spawn('/usr/bin/python3', ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'clients/python/tests'], {
      cwd: REPO,
      env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    if (code !== 0) process.stderr.write(output);
    expect(code).toBe(0);
    expect(output).toMatch(/\d+ passed/);
    expect(output).not.toMatch(/failed|error/i);
  }, 600_000);
});

import { mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadOrCreateHsSecret } from './index.ts';

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-iam-secret-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('loadOrCreateHsSecret', () => {
  it('creates a 0600 secret (and its parent dir) once, then reuses it', async () => {
    const file = path.join(dir, 'nested', 'deeper', 'jwt-secret');
    const first = await loadOrCreateHsSecret(file);
    const text = await readFile(file, 'utf8');
    expect(text.trim()).toMatch(/^[A-Za-z0-9_-]{43}$/); // 32 bytes base64url
    expect(Buffer.from(text.trim(), 'base64url')).toHaveLength(32);
    expect(new TextDecoder().decode(first)).toBe(text.trim());
    expect((await stat(file)).mode & 0o777).toBe(0o600);

    const before = await stat(file);
    const second = await loadOrCreateHsSecret(file);
    expect(Buffer.from(second).equals(Buffer.from(first))).toBe(true);
    expect((await stat(file)).ino).toBe(before.ino);
    expect(await readdir(path.dirname(file))).toEqual(['jwt-secret']); // no temp files left
  });

  it('agrees on one secret when many callers race to create it', async () => {
    const file = path.join(dir, 'jwt-secret');
    const secrets = await Promise.all(Array.from({ length: 8 }, () => loadOrCreateHsSecret(file)));
    const distinct = new Set(secrets.map((s) => Buffer.from(s).toString('hex')));
    expect(distinct.size).toBe(1);
    expect(new TextDecoder().decode(secrets[0])).toBe((await readFile(file, 'utf8')).trim());
    expect(await readdir(dir)).toEqual(['jwt-secret']);
  });

  it('uses an operator-provided secret as is and refuses a weak one without echoing it', async () => {
    const file = path.join(dir, 'jwt-secret');
    await writeFile(file, 'operator-chosen-secret-with-plenty-of-entropy-0123456789\n');
    expect(new TextDecoder().decode(await loadOrCreateHsSecret(file))).toBe('operator-chosen-secret-with-plenty-of-entropy-0123456789');

    await writeFile(file, 'hunter2\n');
    const err = (await loadOrCreateHsSecret(file).then(
      () => undefined,
      (e: unknown) => e,
    )) as Error;
    expect(err).toBeInstanceOf(Error);
    expect(err.message).toMatch(/fewer than 32 characters/);
    expect(err.message).not.toContain('hunter2');
  });
});

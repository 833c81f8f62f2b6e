import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { extract } from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RollboxClient } from '../src/client/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { tarOf as tarBuffer, type TarEntry } from './support/tar.ts';

// Above the busybox base layer's size, so that a tar of / fits.
const MAX_BYTES = 4 * 1024 * 1024;
let cluster: TestCluster;
let token: string;
let sandboxId: string;
let hostDir: string;
let canary: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-f' }], env: { ROLLBOX_FILES_MAX_BYTES: String(MAX_BYTES) } });
  token = await cluster.token('files', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
  sandboxId = (await api(cluster, token, 'POST', '/v1/sandboxes', {})).body.id;
  hostDir = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-canary-'));
  canary = path.join(hostDir, 'canary');
  fs.writeFileSync(canary, 'host secret\n');
});
afterAll(async () => {
  await cluster?.stop();
  if (hostDir) fs.rmSync(hostDir, { recursive: true, force: true });
});

type Entry = TarEntry;
const tarOf = async (entries: Entry[]) => new Uint8Array(await tarBuffer(entries));
async function entriesOf(tar: Uint8Array): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const ex = extract();
  const done = (async () => {
    for await (const entry of ex) {
      const parts: Buffer[] = [];
      for await (const c of entry as AsyncIterable<Buffer>) parts.push(c);
      const h = entry.header;
      const name = (n: string) => n.replace(/^\.\//, '');
      // A hardlink carries no bytes: it shows its target's.
      out[name(h.name)] = h.type === 'symlink' ? `-> ${h.linkname}` : h.type === 'directory' ? 'dir' : h.type === 'link' ? out[name(h.linkname!)]! : Buffer.concat(parts).toString();
    }
  })();
  ex.end(Buffer.from(tar));
  await done;
  return out;
}

const filesUrl = (id: string, p: string, extra = '') => `/v1/sandboxes/${id}/files?path=${encodeURIComponent(p)}${extra}`;
const get = (p: string, extra = '', headers: Record<string, string> = {}) => fetch(`${cluster.url}${filesUrl(sandboxId, p, extra)}`, { headers: { authorization: `Bearer ${token}`, ...headers } });
const put = (p: string, body: Uint8Array, contentType = 'application/octet-stream', extra = '') =>
  api(cluster, token, 'PUT', filesUrl(sandboxId, p, extra), body, { 'content-type': contentType });
const sh = async (cmd: string) => (await api(cluster, token, 'POST', `/v1/sandboxes/${sandboxId}/exec`, { cmd })).body;
const hostState = () => ({
  hash: createHash('sha256').update(fs.readFileSync(canary)).digest('hex'),
  names: fs.readdirSync(hostDir).sort(),
});

describe('files', () => {
  it('round-trips a binary file and a directory tar, and sees what exec wrote', async () => {
    const bytes = new Uint8Array(Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), Buffer.alloc(100_000, 7)]));
    const written = await put('/root/deep/dir/a.bin', bytes, 'application/octet-stream', '&mode=0600');
    expect(written.status, JSON.stringify(written.body)).toBe(200);
    expect(written.body).toEqual({ path: '/root/deep/dir/a.bin', kind: 'file', sizeBytes: bytes.length });
    const back = await get('/root/deep/dir/a.bin');
    expect(back.headers.get('content-type')).toBe('application/octet-stream');
    expect(Buffer.from(await back.arrayBuffer()).equals(Buffer.from(bytes))).toBe(true);
    expect((await sh('stat -c %a /root/deep/dir/a.bin; md5sum < /root/deep/dir/a.bin')).stdout).toBe(`600\n${createHash('md5').update(bytes).digest('hex')}  -\n`);

    await sh('mkdir -p /srv/out && echo from-exec > /srv/out/log && ln -s log /srv/out/link');
    expect(await (await get('/srv/out/log')).text()).toBe('from-exec\n');
    const dir = await get('/srv/out');
    expect(dir.headers.get('content-type')).toBe('application/x-tar');
    expect(await entriesOf(new Uint8Array(await dir.arrayBuffer()))).toMatchObject({ log: 'from-exec\n', link: '-> log' });
    // A single file as a tar, by query or by Accept.
    expect(Object.keys(await entriesOf(new Uint8Array(await (await get('/srv/out/log', '&format=tar')).arrayBuffer())))).toEqual(['log']);
    expect((await get('/srv/out/log', '', { accept: 'application/x-tar' })).headers.get('content-type')).toBe('application/x-tar');

    const tar = await tarOf([
      { name: 'pkg/', type: 'directory', mode: 0o755 },
      { name: 'pkg/main.py', content: 'print(1)\n', mode: 0o755 },
      { name: 'pkg/alias', type: 'symlink', linkname: 'main.py' },
      { name: 'pkg/hard', type: 'link', linkname: 'pkg/main.py' },
      { name: 'abs', type: 'symlink', linkname: '/etc/hostname' },
    ]);
    const extracted = await put('/work', tar, 'application/x-tar');
    expect(extracted.status, JSON.stringify(extracted.body)).toBe(200);
    expect((await sh('cat /work/pkg/alias /work/pkg/hard; stat -c %a /work/pkg/main.py; readlink /work/abs')).stdout).toBe('print(1)\nprint(1)\n755\n/etc/hostname\n');
    expect(await entriesOf(new Uint8Array(await (await get('/work')).arrayBuffer()))).toMatchObject({ 'pkg/main.py': 'print(1)\n', 'pkg/alias': '-> main.py' });

    // A tar of / holds the sandbox's files, not the kernel's pseudo filesystems or the
    // platform's busybox; a directory inside /proc, /sys or /dev is refused.
    const root = await get('/');
    expect(root.status).toBe(200);
    const rootNames = Object.keys(await entriesOf(new Uint8Array(await root.arrayBuffer())));
    expect(rootNames).toEqual(expect.arrayContaining(['bin/busybox', 'root/deep/dir/a.bin', 'work/pkg/main.py']));
    expect(rootNames.filter((n) => /^(proc|sys|dev|\.rollbox)(\/|$)/.test(n))).toEqual([]);
    for (const p of ['/proc/self', '/sys/fs', '/dev', '/proc/../sys']) {
      const refused = await get(p);
      expect(refused.status, p).toBe(400);
      expect((await refused.json()).error.message, p).toContain('not archived');
    }
    // Single files there still read: the reader's own /proc entry.
    expect(await (await get('/proc/self/comm')).text()).toBe('busybox\n');

    expect((await get('/no/such/file')).status).toBe(404);
    expect((await put('relative/path', bytes)).status).toBe(400);
    expect((await put('/work', bytes)).body.error.code).toBe('invalid_request'); // a directory is not a file

    const client = new RollboxClient({ baseUrl: cluster.url, token });
    await client.writeFile(sandboxId, '/root/c.txt', new TextEncoder().encode('client\n'));
    expect(new TextDecoder().decode(await client.readFile(sandboxId, '/root/c.txt'))).toBe('client\n');
    await client.putTar(sandboxId, '/root/t', await tarOf([{ name: 'x', content: 'y' }]));
    expect(await entriesOf(await client.getTar(sandboxId, '/root/t'))).toEqual({ '': 'dir', x: 'y' });
  });

  it('never reads or writes a host canary through symlinks or hostile tars', async () => {
    const before = hostState();
    const rel = `../../../../../..${canary}`;
    await sh(`ln -s ${canary} /root/abs-link; ln -s ${rel} /root/rel-link; ln -s ${hostDir} /root/dir-link; mkdir -p /root/trap && ln -s ${hostDir} /root/trap/esc`);
    for (const p of [canary, '/root/abs-link', '/root/rel-link', `/root/dir-link/canary`, `/proc/1/root${canary}`, `/proc/self/root${canary}`, `/root/${rel}`]) {
      const r = await get(p);
      expect(await r.text(), p).not.toContain('host secret');
      expect(r.status, p).toBe(404); // nothing at that path in the sandbox's own root
    }
    // The sandbox's own file at the same path is what a link reaches.
    await sh(`mkdir -p ${hostDir} && echo sandbox-own > ${canary}`);
    for (const p of ['/root/abs-link', '/root/rel-link', '/root/dir-link/canary']) expect(await (await get(p)).text(), p).toBe('sandbox-own\n');
    expect(await entriesOf(new Uint8Array(await (await get('/root/dir-link')).arrayBuffer()))).toEqual({ '': 'dir', canary: 'sandbox-own\n' });

    // Writes through the links land in the sandbox.
    for (const p of ['/root/abs-link', '/root/rel-link', '/root/dir-link/canary', `/root/dir-link/new-file`]) expect((await put(p, new TextEncoder().encode('pwned\n'))).status, p).toBe(200);
    expect((await sh(`cat ${canary}; ls ${hostDir}`)).stdout).toBe('pwned\ncanary\nnew-file\n');

    const hostile: Entry[][] = [
      [{ name: `../../../../../..${canary}`, content: 'pwned' }],
      [{ name: canary, content: 'pwned' }],
      [{ name: 'esc', type: 'symlink', linkname: hostDir }, { name: 'esc/canary', content: 'pwned' }],
      [{ name: 'up', type: 'symlink', linkname: '../../../../../..' }],
      [{ name: 'hard', type: 'link', linkname: `../../../..${canary}` }],
      [{ name: 'hard', type: 'link', linkname: 'not-in-archive' }],
      [{ name: 'null', type: 'character-device', devmajor: 1, devminor: 3 }],
    ];
    for (const entries of hostile) {
      const r = await put('/root/trap', await tarOf(entries), 'application/x-tar');
      expect(r.status, JSON.stringify(entries)).toBe(400);
      expect(r.body.error.code).toBe('invalid_archive');
    }
    expect((await put('/root/trap', new TextEncoder().encode('not a tar at all'.repeat(64)), 'application/x-tar')).body.error.code).toBe('invalid_archive');
    // A symlink already in the sandbox is followed in the sandbox's root, never the host's.
    expect((await put('/root/trap', await tarOf([{ name: 'esc/canary', content: 'via-tar\n' }, { name: 'esc/planted', content: 'x' }]), 'application/x-tar')).status).toBe(200);
    expect((await sh(`cat ${canary}; ls ${hostDir}`)).stdout).toBe('via-tar\ncanary\nnew-file\nplanted\n');

    expect(hostState()).toEqual(before);
    expect(fs.readFileSync(canary, 'utf8')).toBe('host secret\n');
  });

  it('caps sizes with 413, answers 409 while paused or hibernated and 404 to another tenant', async () => {
    const big = await put('/root/big', new Uint8Array(MAX_BYTES + 1));
    expect(big.status).toBe(413);
    expect(big.body.error.code).toBe('payload_too_large');
    expect((await put('/root/fits', new Uint8Array(MAX_BYTES))).status).toBe(200);
    // Chunked, without Content-Length: cut off at the limit all the same.
    const chunk = new Uint8Array(64 * 1024);
    let sent = 0;
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent > MAX_BYTES) return controller.close();
        sent += chunk.length;
        controller.enqueue(chunk);
      },
    });
    const chunked = await fetch(`${cluster.url}${filesUrl(sandboxId, '/root/chunked')}`, { method: 'PUT', headers: { authorization: `Bearer ${token}` }, body: stream, duplex: 'half' } as RequestInit);
    expect(chunked.status).toBe(413);
    expect((await sh('ls /root/chunked 2>&1')).stdout).toContain('No such file');
    await sh(`head -c ${MAX_BYTES + 1} /dev/zero > /root/big`);
    const tooBig = await get('/root/big');
    expect(tooBig.status).toBe(413);
    expect((await tooBig.json()).error.code).toBe('payload_too_large');
    expect((await get('/root/fits')).status).toBe(200);

    const other = await cluster.token('someone-else', ['sandbox:read', 'sandbox:exec']);
    const stranger = await fetch(`${cluster.url}${filesUrl(sandboxId, '/root/fits')}`, { headers: { authorization: `Bearer ${other}` } });
    expect(stranger.status).toBe(404);
    expect((await api(cluster, other, 'PUT', filesUrl(sandboxId, '/root/x'), new Uint8Array(1))).status).toBe(404);
    const readOnly = await cluster.token('files', ['sandbox:read']);
    expect((await api(cluster, readOnly, 'PUT', filesUrl(sandboxId, '/root/x'), new Uint8Array(1))).status).toBe(403);

    for (const mode of ['freeze', 'hibernate']) {
      expect((await api(cluster, token, 'POST', `/v1/sandboxes/${sandboxId}/pause`, { mode })).status).toBe(200);
      const r = await get('/root/fits');
      expect(r.status, mode).toBe(409);
      expect((await r.json()).error.code).toBe('invalid_state');
      expect((await put('/root/x', new Uint8Array(1))).status).toBe(409);
      expect((await api(cluster, token, 'POST', `/v1/sandboxes/${sandboxId}/resume`, {})).body.state).toBe('running');
    }
    expect((await get('/root/fits')).status).toBe(200);

    const paths = (await api(cluster, undefined, 'GET', '/openapi.json')).body.paths;
    expect(Object.keys(paths['/v1/sandboxes/{id}/files'])).toEqual(expect.arrayContaining(['get', 'put']));
    expect(Object.keys(paths['/v1/layers/{name}'])).toContain('delete');
  });
});

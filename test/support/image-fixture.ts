/**
 * The image whose view every import and pull test checks from inside a sandbox: a base of
 * busybox, a getxattr probe, passwd/group and a few files and owners, and an upper layer
 * of whiteouts, an opaque directory, a directory replaced by a file, a hard link, setuid,
 * a symlink, a FIFO and xattrs (a capability, a user xattr).
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'vitest';
import type { ExecResult } from '../../src/api/index.ts';
import { layerTar, type TarEntry } from './oci.ts';

const PASSWD = 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:App:/home/app:/bin/sh\n';
const GROUP = 'root:x:0:\napp:x:1000:\n';
/** cap_net_raw=ep as the kernel stores it (VFS_CAP_REVISION_2). */
export const CAP_NET_RAW = Buffer.from('0100000200200000000000000000000000000000', 'hex');

/** The image config: env, working directory, user, cmd. */
export const FIXTURE_CONFIG = { Env: ['PATH=/usr/bin:/bin', 'GREETING=hello from the image'], WorkingDir: '/srv/app', User: 'app', Cmd: ['/bin/sh'] };

/** A static getxattr probe: busybox has no getfattr. Prints the value in hex, or the errno's name. */
const PROBE_C = `#include <stdio.h>
#include <sys/xattr.h>
int main(int argc, char **argv) {
  unsigned char buf[4096];
  ssize_t n = lgetxattr(argv[1], argv[2], buf, sizeof buf);
  if (n < 0) { perror("getxattr"); return 1; }
  for (ssize_t i = 0; i < n; i++) printf("%02x", buf[i]);
  printf("\\n");
  return 0;
}
`;

export function busyboxEntries(): TarEntry[] {
  const applets = ['sh', 'ls', 'cat', 'id', 'stat', 'echo', 'pwd', 'test', 'touch', 'mkfifo', 'readlink', 'env', 'sleep', 'true'];
  return [
    { name: 'bin/', type: 'directory' },
    { name: 'bin/busybox', content: readFileSync('/bin/busybox'), mode: 0o755 },
    ...applets.map((a): TarEntry => ({ name: `bin/${a}`, type: 'symlink', linkname: 'busybox' })),
  ];
}

/** The base layer (with the getxattr probe compiled here) and the upper layer, as uncompressed tars. */
export async function imageFixtureLayers(): Promise<{ base: Buffer; upper: Buffer }> {
  const probeDir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-xattr-probe-'));
  try {
    await fs.writeFile(path.join(probeDir, 'probe.c'), PROBE_C);
    execFileSync('musl-gcc', ['-static', '-O2', '-o', path.join(probeDir, 'getxattr'), path.join(probeDir, 'probe.c')]);
    const base = await layerTar([
      ...busyboxEntries(),
      { name: 'bin/getxattr', content: await fs.readFile(path.join(probeDir, 'getxattr')), mode: 0o755 },
      { name: 'etc/', type: 'directory' },
      { name: 'etc/passwd', content: PASSWD },
      { name: 'etc/group', content: GROUP },
      { name: 'etc/motd', content: 'welcome\n' },
      { name: 'data/', type: 'directory' },
      { name: 'data/a', content: 'a\n' },
      { name: 'data/b', content: 'b\n' },
      { name: 'opt/tool/', type: 'directory' },
      { name: 'opt/tool/old', content: 'old\n' },
      { name: 'home/app/', type: 'directory', uid: 1000, gid: 1000, mode: 0o750 },
      { name: 'home/app/notes', content: 'mine\n', uid: 1000, gid: 1000, mode: 0o600 },
      { name: 'srv/app/', type: 'directory', uid: 1000, gid: 1000 },
    ]);
    return { base, upper: await upperLayer() };
  } finally {
    await fs.rm(probeDir, { recursive: true, force: true });
  }
}

export async function upperLayer(): Promise<Buffer> {
  return layerTar([
    { name: 'etc/.wh.motd', content: '' },
    { name: 'data/.wh..wh..opq', content: '' },
    { name: 'data/c', content: 'c\n' },
    { name: 'opt/.wh.tool', content: '' },
    { name: 'opt/tool', content: 'now a file\n' },
    { name: 'usr/bin/', type: 'directory' },
    { name: 'usr/bin/tool', content: '#!/bin/sh\necho tool\n', mode: 0o755 },
    { name: 'usr/bin/tool-again', type: 'link', linkname: 'usr/bin/tool' },
    { name: 'usr/bin/elevate', content: 'x', mode: 0o4755 },
    { name: 'usr/bin/pinger', content: 'x', mode: 0o755, pax: { 'LIBARCHIVE.xattr.security.capability': CAP_NET_RAW.toString('base64') } },
    { name: 'usr/bin/noted', content: 'x', pax: { 'SCHILY.xattr.user.note': 'hello' } },
    { name: 'usr/bin/sh-link', type: 'symlink', linkname: '../../bin/busybox' },
    { name: 'run/', type: 'directory' },
    { name: 'run/pipe', type: 'fifo', mode: 0o640, uid: 1000, gid: 1000 },
  ]);
}

/**
 * What a sandbox of the fixture image must show: the config's defaults, whiteouts, the
 * opaque directory, the directory replaced by a file, hard link, setuid, symlink, owners,
 * FIFO and xattrs; the overlay's own marks invisible. `sh` runs a command in the sandbox.
 */
export async function checkFixtureView(sh: (cmd: string, extra?: object) => Promise<ExecResult>): Promise<void> {
  const out = async (cmd: string, extra: object = {}): Promise<string> => {
    const r = await sh(cmd, extra);
    expect(r.exitCode, `${cmd}: ${r.stderr}`).toBe(0);
    return r.stdout.trim();
  };
  expect(await out('echo "$GREETING"; pwd; id -u; id -g; echo $HOME')).toBe('hello from the image\n/srv/app\n1000\n1000\n/home/app');
  expect((await sh('cat /etc/motd')).exitCode).not.toBe(0);
  expect(await out('ls /data')).toBe('c');
  expect(await out('cat /opt/tool')).toBe('now a file');
  expect(await out('stat -c "%i %h" /usr/bin/tool; stat -c "%i %h" /usr/bin/tool-again')).toMatch(/^(\d+) 2\n\1 2$/);
  expect(await out('stat -c %a /usr/bin/elevate')).toBe('4755');
  expect(await out('readlink /usr/bin/sh-link')).toBe('../../bin/busybox');
  expect(await out('stat -c "%u:%g %a %F" /home/app/notes /run/pipe')).toBe('1000:1000 600 regular file\n1000:1000 640 fifo');
  expect(await out('cat /home/app/notes')).toBe('mine');
  expect(await out('getxattr /usr/bin/pinger security.capability', { user: '0' })).toBe(CAP_NET_RAW.toString('hex'));
  expect(await out('getxattr /usr/bin/noted user.note')).toBe(Buffer.from('hello').toString('hex'));
  expect((await sh('getxattr /data trusted.overlay.opaque', { user: '0' })).exitCode).not.toBe(0);
  expect(await out('ls -a /etc')).not.toMatch(/\.wh\./);
}

import { statfsSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ForkResult, Sandbox } from '../src/api/index.ts';
import { runRollbox } from './support/cli.ts';
import { api, nodesUp, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let token: string;

/** Room for 24 sandboxes of 64 MiB requested: the capacity check fills it. */
const HOST_SLOTS = 24;

beforeAll(async () => {
  cluster = await startTestCluster({
    workers: [{ nodeId: 'node-fork', env: { ROLLBOX_NODE_MEMORY_MIB: String(HOST_SLOTS * 64) } }],
    env: { ROLLBOX_LAYER_GC_GRACE_MS: '1500', ROLLBOX_LAYER_GC_INTERVAL_MS: '300', ROLLBOX_DEFAULT_REQUEST_MEMORY_MIB: '64' },
  });
  token = await cluster.token('forker', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot']);
});
afterAll(async () => cluster?.stop());

const create = async (body: Record<string, unknown> = {}) => {
  const r = await api(cluster, token, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 128, diskMiB: 256 }, ...body });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body as Sandbox;
};
const sh = async (id: string, cmd: string) => {
  const r = await api(cluster, token, 'POST', `/v1/sandboxes/${id}/exec`, { cmd, timeoutMs: 120_000 });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  expect(r.body.exitCode, r.body.stderr).toBe(0);
  return r.body.stdout as string;
};
/** A fork's answer: the result, or (an error status) the error. */
type ForkAnswer = ForkResult & { error: { code: string; message: string } };
const fork = async (id: string, body: Record<string, unknown>, headers: Record<string, string> = {}) => api<ForkAnswer>(cluster, token, 'POST', `/v1/sandboxes/${id}/fork`, body, headers);
const get = async (id: string) => (await api<Sandbox>(cluster, token, 'GET', `/v1/sandboxes/${id}`)).body;
/**
 * Deletes, asking again while the answer is a retryable error (a loaded host's delete can time
 * out): a sandbox left running here would be counted by a later test of the same tenant.
 */
const remove = async (ids: readonly (string | undefined)[]) =>
  Promise.all(
    ids.filter((id): id is string => !!id).map(async (id) => {
      let answer = await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
      for (let attempt = 1; attempt < 5 && answer.status >= 500; attempt++) {
        await new Promise((resolve) => setTimeout(resolve, 1000));
        answer = await api(cluster, token, 'DELETE', `/v1/sandboxes/${id}`);
      }
      expect([200, 404], JSON.stringify(answer.body)).toContain(answer.status);
    }),
  );
const registered = async (digest: string) => (await api(cluster, token, 'GET', `/v1/layers/${digest}`)).status === 200;
const rollbox = (args: string[]) => runRollbox(args, { url: cluster.url, token });
const CHECKSUM = 'find /data -type f | sort | xargs md5sum | md5sum';
/** Bytes in use on the worker's scratch filesystem (every sandbox disk and fork point is a file in it). */
const scratchUsedBytes = (): number => {
  const fs = statfsSync(path.join(cluster.rootDir, 'node-fork', 'worker', 'scratch'));
  return (fs.blocks - fs.bfree) * fs.bsize;
};

describe('fork', () => {
  it('forks a sandbox with 64 MiB in 1,000 files and a background process into 8 children with the same files, each on its own', async () => {
    const parent = await create({ labels: { role: 'parent' } });
    await sh(parent.id, 'mkdir -p /data/sub && echo a > /data/sub/a && echo b > /data/sub/b && i=0; while [ $i -lt 1000 ]; do head -c 65536 /dev/urandom > /data/f$i; i=$((i+1)); done; rm /bin/vi; sync');
    const bg = await api(cluster, token, 'POST', `/v1/sandboxes/${parent.id}/exec`, { cmd: 'while true; do echo tick >> /root/ticks; sleep 0.1; done', background: true });
    expect(bg.status, JSON.stringify(bg.body)).toBe(202);
    const sum = await sh(parent.id, CHECKSUM);
    expect((await sh(parent.id, 'du -sk /data')).split('\t')[0]).toMatch(/^6[0-9]{4}$/);

    const usedBefore = scratchUsedBytes();
    const r = await fork(parent.id, { count: 8, labels: { role: 'child' } });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    const result = r.body;
    expect(result).toMatchObject({ parent: parent.id, parentKind: 'sandbox', processes: false, created: 8, refused: 0 });
    expect(result.parentFrozenMs).toBeGreaterThan(0);
    expect(result.children).toHaveLength(8);
    const ids = result.children.map((c) => c.id!);
    expect(new Set(ids).size).toBe(8);
    for (const child of result.children) expect(child).toEqual({ id: expect.stringMatching(/^sbx_/), state: 'running' });

    // Lineage on each record: every child's disk is a clone of the parent's at the fork point, over the parent's own layers; no layer was packed.
    expect(result.forkPoint).toMatch(/^fp_/);
    expect(result.forkLayer).toBeUndefined();
    for (const id of ids) {
      const child = await get(id);
      expect(child.lineage).toEqual({ parent: parent.id, parentKind: 'sandbox', forkPoint: result.forkPoint, forkedAt: result.forkedAt });
      expect(child.layerDigests).toEqual(parent.layerDigests);
      expect(child.spec.labels).toEqual({ role: 'child' });
      expect(child.spec.resources.memoryMiB).toBe(128);
    }
    expect((await get(parent.id)).lineage).toBeUndefined();
    // Not N copies: the 8 clones share the parent's blocks (64 MiB each if copied).
    expect(scratchUsedBytes() - usedBefore).toBeLessThan(16 * 1024 * 1024);

    // Same files everywhere; no process came along.
    const seen = await Promise.all(ids.map((id) => sh(id, `${CHECKSUM}; ls /bin/vi 2>/dev/null; ps | grep -c 'echo tic[k]' || true`)));
    for (const s of seen) expect(s).toBe(`${sum}0\n`);

    // A write in one child: invisible to the other children and to the parent.
    await sh(ids[0]!, 'echo mine > /data/f0; echo new > /data/only-0; rm /data/f1');
    expect(await sh(ids[0]!, 'cat /data/f0 /data/only-0; ls /data/f1 2>&1 || true')).toMatch(/^mine\nnew\n.*No such file/);
    for (const id of [...ids.slice(1), parent.id]) expect(await sh(id, `${CHECKSUM}; ls /data/only-0 2>/dev/null || echo absent`)).toBe(`${sum}absent\n`);
    // And the parent's writes after the fork, in place into a file the children share blocks with: invisible to them.
    await sh(parent.id, 'head -c 65536 /dev/zero | dd of=/data/f5 conv=notrunc 2>/dev/null; sync');
    for (const id of ids.slice(1, 3)) expect(await sh(id, CHECKSUM)).toBe(sum);
    await sh(parent.id, 'head -c 65536 /dev/urandom > /data/f5');

    // A child forks again: its opaque directory and whiteout carry over, and lineage names the child.
    await sh(ids[1]!, 'rm -rf /data/sub && mkdir /data/sub && echo c > /data/sub/c && rm /data/f2');
    const grand = await fork(ids[1]!, { count: 1 });
    expect(grand.status, JSON.stringify(grand.body)).toBe(201);
    const grandchild = grand.body.children[0]!.id!;
    expect(await sh(grandchild, 'ls /data/sub; ls /data/f2 2>/dev/null || echo no-f2')).toBe('c\nno-f2\n');
    expect((await get(grandchild)).lineage?.parent).toBe(ids[1]);
    expect((await get(grandchild)).layerDigests).toEqual(parent.layerDigests); // a clone of a clone: no layer more
    await remove([grandchild]);
    await sh(ids[1]!, 'rm -rf /data/sub /data/f3');

    // The parent ran on: its background process still writes.
    const ticks = Number(await sh(parent.id, 'wc -l < /root/ticks'));
    await waitFor('parent ticks on', async () => Number(await sh(parent.id, 'wc -l < /root/ticks')) > ticks + 2);
    expect((await get(parent.id)).state).toBe('running');

    // Deleting the parent leaves the children working.
    await remove([parent.id]);
    expect((await get(parent.id)).state).toBe('terminated');
    for (const id of ids.slice(2, 4)) expect(await sh(id, `${CHECKSUM}; echo after > /root/x; cat /root/x`)).toBe(`${sum}after\n`);
    await remove(ids);
  });

  it('children that cannot take a clone (another disk size) stack the fork point packed into one shared layer, kept while a child needs it', async () => {
    const parent = await create();
    await sh(parent.id, 'mkdir -p /data/sub && echo a > /data/sub/a && head -c 4194304 /dev/urandom > /data/blob && rm /bin/vi');
    const sum = await sh(parent.id, 'md5sum < /data/blob');
    const r = await fork(parent.id, { count: 2, resources: { diskMiB: 128 } });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    const { forkLayer, forkedAt } = r.body;
    expect(forkLayer).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(r.body.forkPoint).toBeUndefined();
    expect(r.body.parentFrozenMs).toBeGreaterThan(0);
    const ids = r.body.children.map((c) => c.id!);
    for (const id of ids) {
      const child = await get(id);
      expect(child.lineage).toEqual({ parent: parent.id, parentKind: 'sandbox', forkLayer, forkedAt });
      expect(child.layerDigests).toEqual([...parent.layerDigests, forkLayer]);
      expect(child.spec.resources.diskMiB).toBe(128);
      expect(await sh(id, 'md5sum < /data/blob; ls /data/sub; ls /bin/vi 2>/dev/null || echo no-vi')).toBe(`${sum}a\nno-vi\n`);
    }
    expect((await api(cluster, token, 'GET', `/v1/layers/${forkLayer}`)).body).toMatchObject({ parents: parent.layerDigests });

    // Asked for, the fork point is kept as a (named) snapshot beside the clones, and forks again later as it was.
    await sh(parent.id, 'echo kept > /data/kept'); // (else it packs to the very layer above)
    const kept = await fork(parent.id, { count: 1, snapshot: { name: 'kept-fork-point' } });
    expect(kept.status, JSON.stringify(kept.body)).toBe(201);
    expect(kept.body.forkPoint).toMatch(/^fp_/);
    expect((await api(cluster, token, 'GET', `/v1/layers/${kept.body.forkLayer}`)).body).toMatchObject({ name: 'kept-fork-point', parents: parent.layerDigests });
    await sh(parent.id, 'echo later > /data/blob');
    const again = await api<ForkAnswer>(cluster, token, 'POST', `/v1/snapshots/${kept.body.forkLayer}/fork`, { count: 1 });
    expect(again.status, JSON.stringify(again.body)).toBe(201);
    expect(await sh(again.body.children[0]!.id!, 'md5sum < /data/blob')).toBe(sum);
    await remove([parent.id, kept.body.children[0]!.id, again.body.children[0]!.id]);

    // The fork layer lives while a child needs it, and is collected after the last one.
    await remove([ids[0]]);
    await new Promise((r) => setTimeout(r, 3000)); // past the grace and several collector passes
    expect(await registered(forkLayer!)).toBe(true);
    expect(await sh(ids[1]!, 'md5sum < /data/blob')).toBe(sum);
    await remove([ids[1]]);
    await waitFor('fork layer collected', async () => !(await registered(forkLayer!)), 30_000);
    expect(await registered(kept.body.forkLayer!)).toBe(true); // named
  });

  it('forks a paused and a hibernated sandbox, and a snapshot; children inherit or override network and TTL', async () => {
    const parent = await create({ ttlSeconds: 600 });
    await sh(parent.id, 'echo state-1 > /root/state');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${parent.id}/pause`, {})).status).toBe(200);
    const fromPaused = await fork(parent.id, { count: 2, ttlSeconds: 120, resources: { memoryMiB: 96 }, network: { mode: 'allowlist', allow: [{ cidr: '127.0.0.1' }] } });
    expect(fromPaused.status, JSON.stringify(fromPaused.body)).toBe(201);
    expect(fromPaused.body.parentFrozenMs).toBe(0); // it was frozen already
    expect((await get(parent.id)).state).toBe('paused'); // and stays so
    const pausedKids = fromPaused.body.children.map((c) => c.id!);
    for (const id of pausedKids) {
      expect(await sh(id, 'cat /root/state')).toBe('state-1\n');
      const child = await get(id);
      expect(child.spec.ttlSeconds).toBe(120);
      expect(child.spec.resources).toMatchObject({ memoryMiB: 96, diskMiB: 256 }); // one limit replaced, the others the parent's
      expect(child.spec.network.mode).toBe('allowlist');
    }

    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${parent.id}/resume`, {})).status).toBe(200);
    await sh(parent.id, 'echo state-2 > /root/state');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${parent.id}/pause`, { mode: 'hibernate' })).status).toBe(200);
    const hibernated = await get(parent.id);
    const fromHibernated = await fork(parent.id, { count: 2 });
    expect(fromHibernated.status, JSON.stringify(fromHibernated.body)).toBe(201);
    expect(fromHibernated.body.forkLayer).toBe(hibernated.hibernationLayer);
    expect(fromHibernated.body.parentFrozenMs).toBeUndefined();
    const hibernatedKids = fromHibernated.body.children.map((c) => c.id!);
    for (const id of hibernatedKids) {
      expect(await sh(id, 'cat /root/state')).toBe('state-2\n');
      expect((await get(id)).spec.network.mode).toBe('none'); // the parent's
    }
    // The parent wakes with its own files; a child's write does not reach it.
    await sh(hibernatedKids[0]!, 'echo child > /root/state');
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${parent.id}/resume`, {})).status).toBe(200);
    expect(await sh(parent.id, 'cat /root/state')).toBe('state-2\n');

    const snap = await api(cluster, token, 'POST', `/v1/sandboxes/${parent.id}/snapshot`, { name: 'fork-snap' });
    expect(snap.status).toBe(201);
    const fromSnap = await api<ForkAnswer>(cluster, token, 'POST', `/v1/snapshots/${snap.body.digest}/fork`, { count: 2, env: { BRANCH: 'b' }, resources: { memoryMiB: 64, diskMiB: 128 } });
    expect(fromSnap.status, JSON.stringify(fromSnap.body)).toBe(201);
    expect(fromSnap.body).toMatchObject({ parent: snap.body.digest, parentKind: 'snapshot', forkLayer: snap.body.digest, created: 2 });
    const snapKids = fromSnap.body.children.map((c) => c.id!);
    for (const id of snapKids) {
      expect(await sh(id, 'cat /root/state; echo $BRANCH')).toBe('state-2\nb\n');
      expect((await get(id)).lineage).toMatchObject({ parent: snap.body.digest, parentKind: 'snapshot' });
    }
    await remove([parent.id, ...pausedKids, ...hibernatedKids, ...snapKids]);
  });

  it('a parent rewriting a large file all through the fork: the children get one whole version of it', async () => {
    const parent = await create();
    // 2 MiB (over what is copied outright while frozen), overwritten in place (one write of a whole version, same inode), again and again.
    await sh(parent.id, 'mkdir /data && echo keep > /data/keep && for i in 0 1 2 3 4 5 6 7 8 9; do head -c 2097152 /dev/zero | tr "\\0" $i > /data/v$i; done; cp /data/v0 /data/big');
    const writer = await api(cluster, token, 'POST', `/v1/sandboxes/${parent.id}/exec`, { cmd: 'i=0; while true; do i=$(( (i + 1) % 10 )); dd if=/data/v$i of=/data/big bs=2M count=1 conv=notrunc 2>/dev/null; done', background: true });
    expect(writer.status, JSON.stringify(writer.body)).toBe(202);
    await new Promise((r) => setTimeout(r, 300));
    const r = await fork(parent.id, { count: 2 });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    for (const child of r.body.children) {
      // One version: 2 MiB of a single digit (a torn copy would mix two, or be short).
      expect(await sh(child.id!, 'cat /data/keep; wc -c < /data/big; tr -d "\\n" < /data/big | fold -w 1 | sort -u | wc -l')).toMatch(/^keep\n2097152\n1\n$/);
    }
    await remove([parent.id, ...r.body.children.map((c) => c.id)]);
  });

  it('answers bad input with coded errors, and an Idempotency-Key forks once', async () => {
    const parent = await create();
    for (const count of [0, 65, 1.5]) {
      const r = await fork(parent.id, { count });
      expect(r.status).toBe(400);
      expect(r.body.error.code).toBe('invalid_request');
    }
    expect((await fork(parent.id, {})).body.error.code).toBe('invalid_request');
    const tooSmall = await fork(parent.id, { count: 1, resources: { memoryMiB: 4 } });
    expect([tooSmall.status, tooSmall.body.error.code]).toEqual([400, 'invalid_request']);
    const belowRequests = await fork(parent.id, { count: 1, resources: { memoryMiB: 16 } }); // under the parent's 64 MiB request
    expect([belowRequests.status, belowRequests.body.error.code]).toEqual([400, 'invalid_request']);
    const unknown = await fork('sbx_nope', { count: 1 });
    expect([unknown.status, unknown.body.error.code]).toEqual([404, 'not_found']);
    const noSnap = await api(cluster, token, 'POST', `/v1/snapshots/sha256:${'0'.repeat(64)}/fork`, { count: 1 });
    expect([noSnap.status, noSnap.body.error.code]).toEqual([404, 'not_found']);
    const reader = await cluster.token('forker', ['sandbox:read']);
    expect((await api(cluster, reader, 'POST', `/v1/sandboxes/${parent.id}/fork`, { count: 1 })).status).toBe(403);
    const other = await cluster.token('another-tenant', ['sandbox:create']);
    expect((await api(cluster, other, 'POST', `/v1/sandboxes/${parent.id}/fork`, { count: 1 })).body.error.code).toBe('not_found');

    const key = { 'idempotency-key': 'fork-once-1' };
    const first = await fork(parent.id, { count: 2 }, key);
    expect(first.status, JSON.stringify(first.body)).toBe(201);
    const again = await fork(parent.id, { count: 2 }, key);
    expect(again.status).toBe(200);
    expect(again.body.children.map((c) => c.id)).toEqual(first.body.children.map((c) => c.id));
    expect(again.body.forkLayer).toBe(first.body.forkLayer);
    const changed = await fork(parent.id, { count: 3 }, key);
    expect([changed.status, changed.body.error.code]).toEqual([409, 'conflict']);
    const live = (await api(cluster, token, 'GET', '/v1/sandboxes?state=running')).body.sandboxes as Sandbox[];
    expect(live.filter((s) => s.lineage?.parent === parent.id)).toHaveLength(2);

    await remove([parent.id, ...first.body.children.map((c) => c.id)]);
    const deleted = await fork(parent.id, { count: 1 });
    expect([deleted.status, deleted.body.error.code]).toEqual([409, 'invalid_state']);
  });

  it('rollbox sandbox fork: the children in order, or the answer as JSON; bad flags are coded errors', async () => {
    const parent = await create();
    await sh(parent.id, 'echo cli > /root/from');
    const printed = await rollbox(['sandbox', 'fork', parent.id, '--count', '2', '--label', 'via=cli']);
    expect(printed.code, printed.stderr).toBe(0);
    expect(printed.stdout).toMatch(new RegExp(`^forked ${parent.id} \\(sandbox, frozen [\\d.]+ ms\\) at fork point fp_\\w+: 2 created, 0 refused\n#  ID +STATE +ERROR\n0  sbx_\\w+ +running\n1  sbx_\\w+ +running\n$`));
    const ids = [...printed.stdout.matchAll(/sbx_\w+/g)].map((m) => m[0]).filter((id) => id !== parent.id);
    for (const id of ids) {
      expect(await sh(id, 'cat /root/from')).toBe('cli\n');
      expect((await get(id)).spec.labels).toEqual({ via: 'cli' });
    }
    const json = await rollbox(['sandbox', 'fork', parent.id, '--count', '1', '--memory-mib', '96', '--snapshot', '--json']);
    expect(json.code, json.stderr).toBe(0);
    const answer = JSON.parse(json.stdout) as ForkResult;
    expect(answer).toMatchObject({ parent: parent.id, created: 1, processes: false, forkPoint: expect.stringMatching(/^fp_/), forkLayer: expect.stringMatching(/^sha256:/) });
    const bad = await rollbox(['sandbox', 'fork', parent.id, '--count', '65']);
    expect([bad.code, bad.stderr]).toEqual([1, expect.stringMatching(/^rollbox: invalid_request: count: /)]);
    const missing = await rollbox(['sandbox', 'fork', 'sbx_nope', '--count', '1']);
    expect([missing.code, missing.stderr]).toEqual([1, expect.stringMatching(/^rollbox: not_found: /)]);
    await remove([parent.id, ...ids, answer.children[0]!.id]);
  });

  it('32 forks at once near the host capacity: each child created or refused with a coded error, nothing half made', async () => {
    const parents = await Promise.all([0, 1, 2, 3].map(() => create({ resources: { memoryMiB: 64, diskMiB: 64 } })));
    for (const p of parents) await sh(p.id, `echo ${p.id} > /root/me`);
    const results = await Promise.all(parents.map((p) => fork(p.id, { count: 8 })));
    const children = results.flatMap((r, i) => {
      // A fork none of whose children could be made answers with the refusal itself.
      if (r.status !== 201) {
        expect([r.status, r.body.error.code]).toEqual([503, expect.stringMatching(/^(no_capacity|admission_exhausted)$/)]);
        return Array.from({ length: 8 }, () => ({ error: r.body.error, parent: parents[i]!.id, state: undefined, id: undefined }));
      }
      expect(r.body.created + r.body.refused).toBe(8);
      return r.body.children.map((c) => ({ ...c, parent: parents[i]!.id }));
    });
    const created = children.filter((c) => c.state === 'running');
    const refused = children.filter((c) => c.error);
    expect(created.length + refused.length).toBe(32);
    // The host holds HOST_SLOTS sandboxes; the 4 parents hold 4 of them.
    expect(created.length).toBeLessThanOrEqual(HOST_SLOTS - 4);
    expect(refused.length).toBeGreaterThan(0);
    for (const c of refused) expect(['no_capacity', 'admission_exhausted', 'quota_exceeded']).toContain(c.error!.code);
    for (const c of created.slice(0, 4)) expect(await sh(c.id!, 'cat /root/me')).toBe(`${c.parent}\n`);
    // Nothing half made: every sandbox of the tenant is running or ended, and the running ones are exactly the parents and the created children.
    const all = (await api(cluster, token, 'GET', '/v1/sandboxes?limit=1000')).body.sandboxes as Sandbox[];
    expect(all.filter((s) => ['pending', 'creating', 'stopping'].includes(s.state))).toEqual([]);
    const running = all.filter((s) => s.state === 'running').map((s) => s.id).sort();
    expect(running).toEqual([...parents.map((p) => p.id), ...created.map((c) => c.id!)].sort());
    await remove(running);
  });
});

describe('fork across worker hosts', () => {
  let two: TestCluster;
  let tok: string;
  /** Six sandboxes of 64 MiB per host: a fork of 8 cannot all stay beside its parent. */
  const small = { ROLLBOX_NODE_MEMORY_MIB: String(6 * 64) };
  beforeAll(async () => {
    // fork-b keeps an ext4 scratch filesystem, which cannot clone disks.
    two = await startTestCluster({ workers: [{ nodeId: 'fork-a', env: small }, { nodeId: 'fork-b', env: { ...small, ROLLBOX_NODE_SCRATCH_FS: 'ext4' } }] });
    tok = await two.token('forker', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'admin']);
    await nodesUp(two, tok, 2);
  });
  afterAll(async () => two?.stop());

  const run = async (id: string, cmd: string) => (await api(two, tok, 'POST', `/v1/sandboxes/${id}/exec`, { cmd })).body.stdout as string;
  const read = async (id: string) => (await api<Sandbox>(two, tok, 'GET', `/v1/sandboxes/${id}`)).body;
  const removeAll = (ids: string[]) => Promise.all(ids.map((id) => api(two, tok, 'DELETE', `/v1/sandboxes/${id}`)));

  it('children fill the parent host from clones, the rest land on the other host over the fork point packed once; a host that cannot clone packs', async () => {
    // Two parents: placement takes the less loaded host for the second, so one on each.
    const parents: Sandbox[] = [];
    for (let i = 0; i < 2; i++) {
      const p = await api<Sandbox>(two, tok, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64, diskMiB: 64 } });
      expect(p.status, JSON.stringify(p.body)).toBe(201);
      await run(p.body.id, `mkdir /data && head -c 1048576 /dev/urandom > /data/blob && echo ${p.body.id} > /data/me`);
      parents.push(p.body);
    }
    expect(new Set(parents.map((p) => p.node))).toEqual(new Set(['fork-a', 'fork-b']));
    const [onA, onB] = parents[0]!.node === 'fork-a' ? parents : [parents[1]!, parents[0]!];

    const sum = await run(onA!.id, 'md5sum < /data/blob');
    const r = await api<ForkAnswer>(two, tok, 'POST', `/v1/sandboxes/${onA!.id}/fork`, { count: 8 });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    expect(r.body).toMatchObject({ forkPoint: expect.stringMatching(/^fp_/), forkLayer: expect.stringMatching(/^sha256:/), created: 8 });
    const children = await Promise.all(r.body.children.map((c) => read(c.id!)));
    const beside = children.filter((c) => c.node === 'fork-a');
    const elsewhere = children.filter((c) => c.node === 'fork-b');
    expect(beside.length).toBeGreaterThan(0);
    expect(elsewhere.length).toBeGreaterThan(0);
    for (const c of beside) expect([c.lineage?.forkLayer, c.layerDigests]).toEqual([undefined, onA!.layerDigests]);
    for (const c of elsewhere) expect([c.lineage?.forkLayer, c.layerDigests]).toEqual([r.body.forkLayer, [...onA!.layerDigests, r.body.forkLayer]]);
    for (const c of children) expect(await run(c.id, 'md5sum < /data/blob; cat /data/me')).toBe(`${sum}${onA!.id}\n`);
    await removeAll(children.map((c) => c.id));

    const fromB = await api<ForkAnswer>(two, tok, 'POST', `/v1/sandboxes/${onB!.id}/fork`, { count: 2 });
    expect(fromB.status, JSON.stringify(fromB.body)).toBe(201);
    expect(fromB.body.forkPoint).toBeUndefined();
    expect(fromB.body.forkLayer).toMatch(/^sha256:/);
    for (const c of fromB.body.children) expect(await run(c.id!, 'cat /data/me')).toBe(`${onB!.id}\n`);
    await removeAll([...parents.map((p) => p.id), ...fromB.body.children.map((c) => c.id!)]);
  });
});

import { beforeAll, describe, expect, it } from 'vitest';
import { CreateSandboxRequest, PoolRecord, PutPoolRequest, STATE_TRANSITIONS, type Sandbox, type SandboxState } from '../src/api/index.ts';
import { PoolRegistry, SandboxRegistry, migrateKeyLayout } from '../src/registry/index.ts';
import { useScratchRedis } from './support/scratch-redis.ts';

const scratch = useScratchRedis('registry');
let registry: SandboxRegistry;
beforeAll(() => {
  registry = new SandboxRegistry(scratch.redis);
});

let counter = 0;
function record(tenant = 't1'): Sandbox {
  return { id: `sbx_test${++counter}`, tenant, state: 'pending', node: 'n1', spec: CreateSandboxRequest.parse({}), layerDigests: [], createdAt: new Date().toISOString(), oomKills: 0 };
}
const admit = (r: Sandbox, extra: { idempotencyKey?: string; requestHash?: string; maxLive?: number } = {}) =>
  registry.admit({ record: r, maxLive: extra.maxLive ?? 100, idempotencyKey: extra.idempotencyKey, requestHash: extra.requestHash ?? 'h', settleDeadlineMs: Date.now() + 60_000 });

describe('SandboxRegistry', () => {
  it('enforces the tenant quota atomically under concurrency, and frees a slot on a terminal state', async () => {
    const outcomes = await Promise.all(Array.from({ length: 10 }, () => admit(record('quota-t'), { maxLive: 4 })));
    expect(outcomes.filter((o) => o.kind === 'created')).toHaveLength(4);
    expect(outcomes.filter((o) => o.kind === 'quota')).toHaveLength(6);
    const live = await registry.list('quota-t', { limit: 100 });
    await registry.transition(live[0]!.id, 'failed', { failureReason: 'infra_error' });
    expect((await admit(record('quota-t'), { maxLive: 4 })).kind).toBe('created');
  });

  it('patches a spec atomically: concurrent patches all land, and a state guard refuses other states', async () => {
    const r = record('patch-t');
    await admit(r);
    const hidden = ['/a', '/b', '/c', '/d', '/e'];
    // Patches of network and of hiddenPaths race; a lost update (a write computed from a
    // stale read) would put one field back to its old value.
    const results = await Promise.all(hidden.map((p, i) => registry.patchSpec(r.id, i % 2 ? { hiddenPaths: [p] } : { network: { mode: 'allowlist', allow: [{ cidr: `10.9.${i}.0/24`, protocol: 'tcp' as const }] } })));
    expect(results.every((x) => x !== undefined)).toBe(true);
    const final = (await registry.get(r.id))!.spec;
    expect(final.network.mode).toBe('allowlist');
    expect(final.hiddenPaths).toHaveLength(1);
    // Only while hibernated: a pending sandbox is refused and left as it was.
    expect(await registry.patchSpec(r.id, { hiddenPaths: ['/z'] }, ['hibernated'])).toBeUndefined();
    expect((await registry.get(r.id))!.spec).toEqual(final);
  });

  it('gives one sandbox per idempotency key even when admitted concurrently', async () => {
    const outcomes = await Promise.all(Array.from({ length: 8 }, () => admit(record('idem-t'), { idempotencyKey: 'k1', requestHash: 'body-1' })));
    expect(outcomes.filter((o) => o.kind === 'created')).toHaveLength(1);
    const ids = new Set(outcomes.flatMap((o) => (o.kind === 'exists' ? [o.sandboxId] : [])));
    expect(ids.size).toBe(1);
    expect(outcomes.find((o) => o.kind === 'exists')).toMatchObject({ requestHash: 'body-1' });
  });

  it('never moves a state backwards and ends each sandbox exactly once', async () => {
    const r = record();
    await admit(r);
    expect((await registry.transition(r.id, 'creating')).kind).toBe('ok');
    expect((await registry.transition(r.id, 'pending')).kind).toBe('refused');
    expect((await registry.transition(r.id, 'running', { node: 'other-node' })).kind).toBe('refused');
    expect((await registry.transition(r.id, 'running', { node: 'n1' })).kind).toBe('ok');
    const enders = await Promise.all([
      registry.transition(r.id, 'terminated'),
      registry.transition(r.id, 'failed', { failureReason: 'lost' }),
      registry.transition(r.id, 'failed', { failureReason: 'oom' }),
      registry.transition(r.id, 'terminated'),
    ]);
    expect(enders.filter((o) => o.kind === 'ok')).toHaveLength(1);
    const final = (await registry.get(r.id))!;
    for (const to of Object.keys(STATE_TRANSITIONS) as SandboxState[]) expect((await registry.transition(r.id, to)).kind).toBe('refused');
    expect(await registry.get(r.id)).toEqual(final);
    expect(final.endedAt).toBeDefined();
    expect(await registry.sandboxesOfNode('n1')).not.toContain(r.id);
  });

  it('reports missing sandboxes and lists by label, job and state', async () => {
    expect((await registry.transition('sbx_nope', 'running')).kind).toBe('missing');
    const a = { ...record('list-t'), spec: CreateSandboxRequest.parse({ labels: { task: 'x' }, job: 'j1' }) };
    const b = record('list-t');
    await admit(a);
    await admit(b);
    expect((await registry.list('list-t', { limit: 10, label: 'task=x' })).map((s) => s.id)).toEqual([a.id]);
    expect((await registry.list('list-t', { limit: 10, job: 'j1' })).map((s) => s.id)).toEqual([a.id]);
    expect((await registry.list('list-t', { limit: 10, state: 'pending' })).length).toBe(2);
    expect(await registry.list('other-tenant', { limit: 10 })).toEqual([]);
  });
});

describe('key layout migration of warm pools', () => {
  it('moves pool definitions from the old hash into their slots, keeps their ready lists, and offers then check the version', async () => {
    const redis = scratch.redis;
    const record = PoolRecord.parse({ ...PutPoolRequest.parse({ size: 1 }), name: 'old-pool', layerDigests: [], version: 'v1', createdAt: '2026-12-01T00:00:00Z', updatedAt: '2026-12-01T00:00:00Z' });
    // As written before the hash tags: definitions in one hash, ready lists by name.
    await redis.hset('rb:pools', 'old-pool', JSON.stringify(record));
    await redis.rpush('rb:pool:ready:old-pool:v1:n1', 'sbx_ready1');
    await redis.del('rb:key-layout');
    await migrateKeyLayout(redis);
    const pools = new PoolRegistry(redis);
    expect(await pools.list()).toEqual([record]);
    expect(await pools.ready(record, 'n1')).toEqual(['sbx_ready1']);
    expect([...(await pools.readyListsOf('n1')).values()]).toEqual([{ pool: 'old-pool', version: 'v1', ids: ['sbx_ready1'] }]);
    expect(await pools.offer(record, 'n1', 'sbx_ready2')).toBe(true);
    expect(await pools.offer({ name: 'old-pool', version: 'v0' }, 'n1', 'sbx_stale')).toBe(false);
    expect(await pools.delete('old-pool')).toBe(true);
    expect(await pools.offer(record, 'n1', 'sbx_late')).toBe(false);
    expect(await redis.keys('rb:*pool*')).toEqual([]);
  });
});

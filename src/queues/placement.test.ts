import { describe, expect, it } from 'vitest';
import type { NodeHeartbeat } from '../api/index.ts';
import { networkUnavailable } from '../gateway/placement-of.ts';
import { chooseNode, idleHeartbeat, type PlacementCandidate, type PlacementRequest } from './placement.ts';

function node(nodeId: string, usedMemoryMiB: number, extra: Partial<NodeHeartbeat> = {}): PlacementCandidate {
  return {
    ageMs: 100,
    assumed: { memoryMiB: 0, cpuMillis: 0, sandboxes: 0 },
    heartbeat: {
      ...idleHeartbeat(nodeId, 'local', { cpuMillis: 16_000, memoryMiB: 10_000, maxSandboxes: 100, maxStarting: 8 }),
      used: { cpuMillis: 0, memoryMiB: usedMemoryMiB },
      ...extra,
    },
  };
}

function seeded(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32);
}

const request = { memoryMiB: 512, cpuMillis: 1000, pool: 'local', exclude: new Set<string>() };
const options = { choices: 2, staleAfterMs: 3000, random: seeded(1) };

describe('chooseNode', () => {
  it('spreads small sandboxes over nodes of one host whose measured memory differs a little (no herding)', () => {
    const nodes = [node('a', 0, { measured: { cpuLoad: 0, memoryUsedFraction: 0.3 } }), node('b', 0, { measured: { cpuLoad: 0, memoryUsedFraction: 0.31 } })];
    const counts = new Map<string, number>();
    for (let i = 0; i < 10; i++) {
      const chosen = chooseNode(nodes, { ...request, memoryMiB: 16, cpuMillis: 10 }, options)!;
      chosen.assumed = { memoryMiB: chosen.assumed.memoryMiB + 16, cpuMillis: chosen.assumed.cpuMillis + 10, sandboxes: chosen.assumed.sandboxes + 1 };
      counts.set(chosen.heartbeat.nodeId, (counts.get(chosen.heartbeat.nodeId) ?? 0) + 1);
    }
    expect(counts.get('a')).toBe(5);
    expect(counts.get('b')).toBe(5);
    // A host short of memory for real is avoided.
    const pressed = [node('a', 0, { measured: { cpuLoad: 0, memoryUsedFraction: 0.95 } }), node('b', 5000)];
    expect(chooseNode(pressed, request, options)?.heartbeat.nodeId).toBe('b');
  });

  it('places an allowlist network only on nodes whose network self-test passes (or that report none)', () => {
    const failing = node('failing', 0, { network: { allowlist: 'failing', checkedAtMs: 1, detail: 'forward path blocked', firewall: [] } });
    const passing = node('passing', 5_000, { network: { allowlist: 'ok', checkedAtMs: 1, firewall: ['iptables-nft filter DOCKER-USER (forward)'] } });
    for (let i = 0; i < 20; i++) expect(chooseNode([failing, passing], { ...request, network: true }, options)?.heartbeat.nodeId).toBe('passing');
    expect(chooseNode([failing], { ...request, network: true }, options)).toBeUndefined();
    expect(chooseNode([failing], request, options)?.heartbeat.nodeId).toBe('failing');
    expect(chooseNode([node('unreported', 0)], { ...request, network: true }, options)?.heartbeat.nodeId).toBe('unreported');
  });

  it("places an agent sandbox (network.gateway) only on nodes whose probe finds a gateway answering (or that report none yet), and explains when none does", () => {
    const ok = { allowlist: 'ok' as const, checkedAtMs: 1, firewall: [] };
    const cut = node('cut', 0, { network: { ...ok, gateway: { target: '10.0.0.9:9180', answering: false, checkedAtMs: 1_700_000_000_000 } } });
    const reaching = node('reaching', 5_000, { network: { ...ok, gateway: { target: '10.0.0.8:9180', answering: true, checkedAtMs: 1 } } });
    const agent = { ...request, network: true, gateway: true };
    for (let i = 0; i < 20; i++) expect(chooseNode([cut, reaching], agent, options)?.heartbeat.nodeId).toBe('reaching');
    expect(chooseNode([node('unprobed', 0, { network: ok })], agent, options)?.heartbeat.nodeId).toBe('unprobed');
    // Other sandboxes still go there: its own network works.
    expect(chooseNode([cut], { ...request, network: true }, options)?.heartbeat.nodeId).toBe('cut');
    const place = (p: PlacementRequest) => chooseNode([cut], p, options)?.heartbeat.nodeId;
    expect(place(agent)).toBeUndefined();
    const why = networkUnavailable(agent, [cut], place);
    expect(why).toMatchObject({ code: 'network_unavailable', message: expect.stringContaining('cut: none of its gateways answered at 2023-11-14T22:13:20.000Z (its rule still names 10.0.0.9:9180)') });
  });

  it('filters unhealthy, stale, excluded, wrong-pool and full nodes', () => {
    const nodes = [
      node('sick', 0, { healthy: false }),
      { ...node('stale', 0), ageMs: 10_000 },
      node('excluded', 0),
      node('cloud', 0, { pool: 'cloud' }),
      node('full', 9_800),
      node('ok', 5_000),
    ];
    for (let i = 0; i < 50; i++) {
      expect(chooseNode(nodes, { ...request, exclude: new Set(['excluded']) }, options)?.heartbeat.nodeId).toBe('ok');
    }
    expect(chooseNode([node('full', 9_800)], request, options)).toBeUndefined();
  });

  it('filters nodes whose reported disk cannot take diskMiB; nodes not reporting disk stay eligible', () => {
    const disk = (nodeId: string, usedDiskMiB: number) => {
      const c = node(nodeId, 0);
      c.heartbeat.capacity.diskMiB = 1000;
      c.heartbeat.used.diskMiB = usedDiskMiB;
      return c;
    };
    expect(chooseNode([disk('full', 900), disk('ok', 800)], { ...request, diskMiB: 200 }, options)?.heartbeat.nodeId).toBe('ok');
    expect(chooseNode([disk('full', 900)], { ...request, diskMiB: 200 }, options)).toBeUndefined();
    expect(chooseNode([node('legacy', 0)], { ...request, diskMiB: 200 }, options)?.heartbeat.nodeId).toBe('legacy');
  });

  it('skips hosts still syncing, hosts to avoid (draining), and hosts missing a required layer', () => {
    const cloud = { ...request, pool: 'cloud' };
    const nodes = [
      node('syncing', 0, { pool: 'cloud', ready: false, syncedLayers: ['sha256:a'] }),
      node('draining', 0, { pool: 'cloud', syncedLayers: ['sha256:a'] }),
      node('without-a', 0, { pool: 'cloud', syncedLayers: ['sha256:b'] }),
      node('with-a', 5_000, { pool: 'cloud', syncedLayers: ['sha256:a', 'sha256:b'] }),
    ];
    for (let i = 0; i < 30; i++) {
      expect(chooseNode(nodes, { ...cloud, avoid: new Set(['draining']), requiredLayers: ['sha256:a'] }, options)?.heartbeat.nodeId).toBe('with-a');
    }
    expect(chooseNode(nodes, { ...cloud, requiredLayers: ['sha256:c'] }, options)).toBeUndefined();
  });

  it('of two sampled nodes takes the less loaded', () => {
    const nodes = [node('busy', 8_000), node('idle', 0)];
    for (let i = 0; i < 20; i++) expect(chooseNode(nodes, request, options)?.heartbeat.nodeId).toBe('idle');
  });

  it('counts assumed load so back-to-back placements spread instead of herding', () => {
    const nodes = [node('a', 0), node('b', 0)];
    const counts: Record<string, number> = { a: 0, b: 0 };
    for (let i = 0; i < 100; i++) {
      const chosen = chooseNode(nodes, { ...request, memoryMiB: 64 }, options)!;
      counts[chosen.heartbeat.nodeId]!++;
      chosen.assumed.memoryMiB += 64;
      chosen.assumed.sandboxes += 1;
    }
    expect(Math.abs(counts.a! - counts.b!)).toBeLessThanOrEqual(1);
  });

  it('with many nodes, a burst from a stale snapshot does not all land on the argmin', () => {
    const nodes = Array.from({ length: 20 }, (_, i) => node(`n${i}`, i === 0 ? 0 : 100));
    const hits = new Map<string, number>();
    const random = seeded(7);
    for (let i = 0; i < 200; i++) {
      const id = chooseNode(nodes, request, { ...options, random })!.heartbeat.nodeId;
      hits.set(id, (hits.get(id) ?? 0) + 1);
    }
    // With d=2 out of 20, the least loaded node is in the sample about 10% of the time.
    expect(hits.get('n0')!).toBeLessThan(60);
    expect(hits.size).toBeGreaterThan(10);
  });
});

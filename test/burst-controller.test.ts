import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CreateSandboxRequest, type NodeHeartbeat } from '../src/api/index.ts';
import { BurstController, CommandProvider, TraceRecorder } from '../src/burst/index.ts';
import { NodeDirectory, idleHeartbeat, type PlacementRequest } from '../src/queues/index.ts';
import { CLUSTER_OWNER, ImageRegistry, LayerRegistry, SandboxRegistry, keys } from '../src/registry/index.ts';
import { useScratchRedis } from './support/scratch-redis.ts';

const DIGEST = `sha256:${'ab'.repeat(32)}`;
const scratch = useScratchRedis('burstctl');
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-burstctl-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Operator programs as a command provider would run them: they log what they were asked. */
async function scripts(): Promise<{ provision: string; terminate: string; list: string }> {
  const write = async (name: string, body: string) => {
    const file = path.join(dir, name);
    await writeFile(file, `#!/bin/sh\ncd ${dir}\n${body}\n`);
    await chmod(file, 0o755);
    return file;
  };
  return {
    provision: await write('provision', `cat >> provisions.log; echo >> provisions.log; n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; echo "{\\"id\\":\\"vm-$n\\"}"`),
    terminate: await write('terminate', `cat >> terminations.log; echo >> terminations.log`),
    list: await write('list', `echo '{"hosts":[{"id":"vm-1","state":"running","startedAtMs":0}]}'`),
  };
}

/** The controllers' and the directory's clock: the test moves it, no wall-clock waits. */
let clock = 1_800_000_000_000;
let beats = 0;

function heartbeat(nodeId: string, pool: string, usedMemoryMiB: number, extra: Partial<NodeHeartbeat> = {}): NodeHeartbeat {
  return {
    // A new atMs each time: the directory takes an unchanged one for a silent node.
    ...idleHeartbeat(nodeId, pool, { cpuMillis: 8000, memoryMiB: 1000, maxSandboxes: 100, maxStarting: 8 }, clock + ++beats),
    used: { cpuMillis: 0, memoryMiB: usedMemoryMiB },
    ...extra,
  };
}

const lines = async (name: string) => (await readFile(path.join(dir, name), 'utf8').catch(() => '')).split('\n').filter(Boolean).map((l) => JSON.parse(l));

describe('burst controller across two gateways (real Redis, command provider)', () => {
  it('one leader scales out for diverted demand; the other takes over and retires the idle host', async () => {
    const now = () => clock;
    const directory = new NodeDirectory(scratch.redis, { refreshMs: 100, now });
    const layers = new LayerRegistry(scratch.redis);
    const registry = new SandboxRegistry(scratch.redis);
    await layers.register({ digest: DIGEST, sizeBytes: 1, name: 'base', parents: [], createdAt: new Date().toISOString() }, CLUSTER_OWNER);
    const provider = new CommandProvider({ ...(await scripts()), timeoutMs: 10_000 });
    const controller = (gatewayId: string) =>
      new BurstController({
        redis: scratch.redis,
        directory,
        images: new ImageRegistry(scratch.redis, layers),
        registry,
        provider,
        config: { tickMs: 100, syncLayers: ['base'], localPool: 'local', lostAfterMs: 5000, redisUrl: scratch.url },
        gatewayId,
        gatewayUrl: () => 'http://gateway.test',
        issueHostToken: async () => 'host-token',
        recorder: new TraceRecorder(scratch.redis, 0),
        metricsRegistry: new Registry(),
        logger: pino({ level: 'silent' }),
        now,
        random: () => 0,
      });
    const a = controller('gw-a');
    const b = controller('gw-b');
    const tickBoth = async () => {
      clock += 100;
      await directory.refresh();
      await a.tick();
      await b.tick();
    };
    await a.setPolicy({ ...(await a.status()).policy, divertAboveUtilization: 0.5, stopBelowUtilization: 0.4, maxCloudHosts: 1, idleTerminateMs: 200, cloudHostSandboxes: 2 });
    await scratch.redis.hset(keys.nodes, 'local-a', JSON.stringify(heartbeat('local-a', 'local', 900)));
    await tickBoth();
    expect((await b.status()).diverting).toBe(true);
    expect((await b.status()).syncedLayers).toEqual([DIGEST]);

    // A diverted create with no cloud host falls back local and becomes demand.
    const spec = CreateSandboxRequest.parse({});
    await registry.admit({ record: { id: 'sbx_1', tenant: 't', state: 'pending', node: 'local-a', spec, layerDigests: [DIGEST], createdAt: new Date().toISOString(), oomKills: 0 }, maxLive: 10, requestHash: 'h', settleDeadlineMs: Date.now() + 60_000 });
    const local: PlacementRequest = { memoryMiB: 64, cpuMillis: 100, pool: 'local', exclude: new Set() };
    const tried: PlacementRequest[] = [];
    const routed = await b.placeCreate('sbx_1', spec, [DIGEST], local, async (p) => (tried.push(p), p.pool === 'local' ? 'local-a' : undefined));
    expect(routed.node).toBe('local-a');
    expect(tried.map((p) => [p.pool, p.requiredLayers])).toEqual([['cloud', [DIGEST]], ['local', undefined]]);
    for (let i = 0; i < 5; i++) await tickBoth();
    const provisions = await lines('provisions.log');
    expect(provisions).toHaveLength(1); // one leader, within maxCloudHosts
    expect(provisions[0]).toMatchObject({ action: 'provision', pool: 'cloud', gatewayUrl: 'http://gateway.test', token: 'host-token', redisUrl: scratch.url, layers: [DIGEST], slots: 2 });
    const hostId: string = provisions[0].hostId;
    expect((await b.status()).cloudHosts).toMatchObject([{ id: hostId, state: 'provisioning' }]);

    // Syncing hosts stay provisioning; ready ones join.
    await scratch.redis.hset(keys.nodes, hostId, JSON.stringify(heartbeat(hostId, 'cloud', 0, { ready: false })));
    await tickBoth();
    expect((await b.status()).cloudHosts[0]?.state).toBe('provisioning');
    await scratch.redis.hset(keys.nodes, hostId, JSON.stringify(heartbeat(hostId, 'cloud', 0, { ready: true, syncedLayers: [DIGEST] })));
    await tickBoth();
    expect((await b.status()).cloudHosts[0]?.state).toBe('ready');

    // The leader goes away; the other gateway leads from the shared state. The demand
    // ends, the host idles (idleTerminateMs 200), is drained, and after the drain grace
    // (2 ticks + 1 s) terminated once: ticks of 300 ms on the test's clock.
    await a.stop();
    await registry.transition('sbx_1', 'terminated', { from: ['pending'] });
    const seen: string[] = [];
    for (let i = 0; i < 12 && (await b.status()).cloudHosts.length > 0; i++) {
      clock += 300;
      await scratch.redis.hset(keys.nodes, hostId, JSON.stringify(heartbeat(hostId, 'cloud', 0, { ready: true, syncedLayers: [DIGEST] })));
      await scratch.redis.hset(keys.nodes, 'local-a', JSON.stringify(heartbeat('local-a', 'local', 900)));
      await directory.refresh();
      await b.tick();
      seen.push((await b.status()).cloudHosts[0]?.state ?? 'gone');
    }
    expect(seen).toEqual(['terminating', 'terminating', 'terminating', 'terminating', 'gone']);
    await b.stop(); // waits for the termination the controller started in the background
    expect(await lines('terminations.log')).toEqual([{ action: 'terminate', id: 'vm-1' }]);
    expect((await b.status()).cloudHosts).toEqual([]);
    expect(await lines('provisions.log')).toHaveLength(1);
  });
});

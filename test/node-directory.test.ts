import { describe, expect, it } from 'vitest';
import { NodeDirectory, idleHeartbeat } from '../src/queues/index.ts';
import { connectRedis } from '../src/redis/index.ts';
import { keys } from '../src/registry/index.ts';
import { useScratchRedis } from './support/scratch-redis.ts';

/**
 * A gateway's view of the worker hosts (NodeDirectory) over a real Redis: how old a
 * heartbeat is, as placement, the create handshake and the janitor judge it.
 */
const scratch = useScratchRedis('nodedir');
const CAPACITY = { memoryMiB: 4096, cpuMillis: 4000, maxSandboxes: 100, maxStarting: 8 };

describe('node directory', () => {
  it("measures a heartbeat's age up to its last read: a gateway that falls behind does not call live hosts silent", async () => {
    let nowMs = 1_000_000;
    const directory = new NodeDirectory(scratch.redis, { refreshMs: 1000, now: () => nowMs });
    const beat = (atMs: number) => scratch.redis.hset(keys.nodes, 'node-a', JSON.stringify(idleHeartbeat('node-a', 'local', CAPACITY, atMs)));
    await beat(1);
    await directory.refresh();
    expect(directory.isSilent('node-a', 5000)).toBe(false);

    // Its own reads stopped for a minute (an event loop saturated by a burst): nothing newer is known.
    nowMs += 60_000;
    expect(directory.isSilent('node-a', 5000)).toBe(false);
    expect(directory.silentNodes(5000)).toEqual([]);
    expect(directory.candidates()[0]!.ageMs).toBe(0);

    // Read again: the host has beaten meanwhile, so it is fresh.
    await beat(2);
    await directory.refresh();
    expect(directory.isSilent('node-a', 5000)).toBe(false);

    // Read again later with the same heartbeat: it is silent now, by what was read.
    nowMs += 6000;
    await directory.refresh();
    expect(directory.candidates()[0]!.ageMs).toBe(6000);
    expect(directory.isSilent('node-a', 5000)).toBe(true);
    expect(directory.silentNodes(5000)).toEqual(['node-a']);
    expect(directory.isSilent('node-gone', 5000)).toBe(true);
    await scratch.redis.del(keys.nodes);
  });

  it('does not count silence while Redis held its reads: after a stall (a failover) each host gets its full lost time', async () => {
    // A read slower than refreshMs is a stall; an ordinary one stays well under it, even on a busy CI host.
    const directory = new NodeDirectory(scratch.redis, { refreshMs: 1000, now: Date.now });
    await scratch.redis.hset(keys.nodes, 'node-c', JSON.stringify(idleHeartbeat('node-c', 'local', CAPACITY, 1)));
    await directory.refresh();
    // Redis answers no one for 1.5 s (as through a failover): the host's beats are held up too.
    const pauser = connectRedis(scratch.url);
    await pauser.call('CLIENT', 'PAUSE', '1500', 'ALL');
    await directory.refresh();
    await pauser.quit();
    // Read again at once: the heartbeat is 1.5 s unchanged, but the directory saw none of that time.
    await directory.refresh();
    expect(directory.isSilent('node-c', 1000)).toBe(false);
    // Silence it could see counts: unchanged for more than the lost time after reads came back.
    await new Promise((r) => setTimeout(r, 1200));
    await directory.refresh();
    expect(directory.isSilent('node-c', 1000)).toBe(true);
    await scratch.redis.del(keys.nodes);
  });

  it('sums the load it placed until a heartbeat reports it handled, and joins refreshes asked at once', async () => {
    const directory = new NodeDirectory(scratch.redis, { refreshMs: 1000, now: () => 5_000_000 });
    await scratch.redis.hset(keys.nodes, 'node-b', JSON.stringify(idleHeartbeat('node-b', 'local', CAPACITY, 1)));
    await directory.refresh();
    directory.assume('node-b', 'sbx_1', { memoryMiB: 256, cpuMillis: 500 });
    directory.assume('node-b', 'sbx_2', { memoryMiB: 128, cpuMillis: 250 });
    directory.assume('node-b', 'sbx_2', { memoryMiB: 128, cpuMillis: 250 });
    expect(directory.candidates()[0]!.assumed).toEqual({ memoryMiB: 384, cpuMillis: 750, sandboxes: 2 });
    directory.forget('node-b', 'sbx_1');
    expect(directory.candidates()[0]!.assumed).toEqual({ memoryMiB: 128, cpuMillis: 250, sandboxes: 1 });

    await scratch.redis.hset(keys.nodes, 'node-b', JSON.stringify({ ...idleHeartbeat('node-b', 'local', CAPACITY, 2), handledCreates: ['sbx_2'] }));
    const [a, b] = [directory.refresh(), directory.refresh()];
    expect(a).toBe(b);
    await a;
    expect(directory.candidates()[0]!.assumed).toEqual({ memoryMiB: 0, cpuMillis: 0, sandboxes: 0 });
    await scratch.redis.del(keys.nodes);
  });
});

import { describe, expect, it } from 'vitest';
import { PrefetchRecorder } from '../src/layers/lazy/prefetch-recorder.ts';
import { PrefetchLists, keys } from '../src/registry/index.ts';
import { useScratchRedis } from './support/scratch-redis.ts';

const digest = (n: number) => `sha256:${n.toString(16).padStart(2, '0').repeat(32)}`;
const scratch = useScratchRedis('prefetch');

describe('prefetch lists: the chunks most first runs read', () => {
  it('keeps chunks more than half of the recorded runs read, not the union', async () => {
    const lists = new PrefetchLists(scratch.redis, 4);
    const d = digest(1);
    // Four first runs: every one reads the "imports" 10-12; each its own chunks besides.
    const runs = [[10, 11, 12, 50], [10, 11, 12, 60, 61], [10, 11, 12, 50, 70], [10, 12, 80]];
    for (const chunks of runs) {
      expect(await lists.openRun(d)).toBe(true);
      await lists.record(d, chunks);
    }
    // 11 is read by 3 of 4, 50 by 2 of 4 (not more than half), the rest by one.
    expect(await lists.chunks(d)).toEqual([10, 11, 12]);
    // A fifth run is not recorded, and does not change what counts.
    expect(await lists.openRun(d)).toBe(false);
    expect(await lists.chunks(d)).toEqual([10, 11, 12]);
    await lists.forget(d);
    expect(await lists.chunks(d)).toEqual([]);
    expect(await scratch.redis.exists(keys.layerPrefetchRuns(d), keys.layerPrefetchCounts(d))).toBe(0);
  });

  it('a single first run is the list; two runs keep what both read', async () => {
    const lists = new PrefetchLists(scratch.redis, 8);
    const d = digest(2);
    await lists.openRun(d);
    await lists.record(d, [1, 2, 3]);
    expect(await lists.chunks(d)).toEqual([1, 2, 3]);
    await lists.openRun(d);
    await lists.record(d, [2, 3, 4]);
    expect(await lists.chunks(d)).toEqual([2, 3]);
  });

  it("the recorder counts each chunk once per run, only within the run's window", async () => {
    const lists = new PrefetchLists(scratch.redis, 8);
    const d = digest(3);
    const recorder = new PrefetchRecorder(lists, 400);
    recorder.note(d, 0, 2); // no run open: not recorded
    recorder.startRun(d);
    recorder.note(d, 5, 3);
    recorder.note(d, 6, 1);
    await recorder.flush();
    recorder.note(d, 7, 2);
    await recorder.flush();
    expect(await scratch.redis.hgetall(keys.layerPrefetchCounts(d))).toEqual({ 5: '1', 6: '1', 7: '1', 8: '1' });
    await new Promise((r) => setTimeout(r, 450));
    recorder.note(d, 20, 1);
    await recorder.flush();
    expect(Object.keys(await scratch.redis.hgetall(keys.layerPrefetchCounts(d)))).not.toContain('20');
    expect(await scratch.redis.get(keys.layerPrefetchRuns(d))).toBe('1');
  });
});

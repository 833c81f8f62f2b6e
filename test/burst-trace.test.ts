import { describe, expect, it } from 'vitest';
import { CreateSandboxRequest } from '../src/api/index.ts';
import { TraceRecorder, exportTrace } from '../src/burst/index.ts';
import { LayerRegistry, SandboxRegistry } from '../src/registry/index.ts';
import { useScratchRedis } from './support/scratch-redis.ts';

const scratch = useScratchRedis('burst-trace');

describe('burst trace recorder', () => {
  it('keeps creates that end out of their arrival order (a burst), and exports them by arrival', async () => {
    const { redis } = scratch;
    const recorder = new TraceRecorder(redis, 1000);
    const request = (memoryMiB: number) => CreateSandboxRequest.parse({ resources: { memoryMiB, cpuMillis: 100 } });
    const t0 = Date.now() - 10_000;
    // Arrived t0+3 but ended first; then the earlier arrivals end.
    recorder.record(t0 + 3, 'a', request(64), undefined);
    recorder.record(t0 + 1, 'a', request(32), undefined);
    recorder.record(t0 + 2, 'a', request(48), undefined);
    // Arrived before the export's start: left out, though recorded after it.
    recorder.record(t0 - 5, 'a', request(16), undefined);
    await redis.ping(); // the recorder does not wait for its XADDs: they are sent before this
    const trace = await exportTrace({ redis, registry: new SandboxRegistry(redis), layers: new LayerRegistry(redis), now: Date.now }, t0);
    expect(trace.events.map((e) => [e.atMs, e.memoryMiB])).toEqual([
      [0, 32],
      [1, 48],
      [2, 64],
    ]);
  });
});

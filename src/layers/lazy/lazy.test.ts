import { describe, expect, it } from 'vitest';
import { FillQueue, type FillJob } from './fetcher.ts';
import { GateDecoder, encode } from './protocol.ts';

const id = 'ab'.repeat(32);

/** A gate message as rollbox-gate.c writes it: u32 length, type, body. */
function fromGate(type: number, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32LE(body.length + 1, 0);
  head.writeUInt8(type, 4);
  return Buffer.concat([head, body]);
}
const u32 = (...v: number[]) => {
  const b = Buffer.alloc(4 * v.length);
  v.forEach((x, i) => b.writeUInt32LE(x, 4 * i));
  return b;
};

describe('gate protocol', () => {
  it('frames what the worker sends as the gate reads it', () => {
    const attach = encode.attach(id, 3 * 4096 + 5, 4096, '/c/x.data', '/c/x.map');
    expect(attach.readUInt32LE(0)).toBe(attach.length - 4);
    expect(attach.readUInt8(4)).toBe(1);
    expect(attach.subarray(5, 69).toString()).toBe(id);
    expect(attach.readBigUInt64LE(69)).toBe(BigInt(3 * 4096 + 5));
    expect(attach.readUInt32LE(77)).toBe(4096);
    expect(attach.readUInt16LE(81)).toBe('/c/x.data'.length);
    const head = encode.dataHead(id, 7, 100);
    expect([head.readUInt32LE(0), head.readUInt8(4), head.readUInt32LE(69), head.length]).toEqual([1 + 64 + 4 + 100, 3, 7, 73]);
    expect(() => encode.detach('not-an-id')).toThrow();
  });

  it('decodes what the gate sends, across any split of the stream', () => {
    const stream = Buffer.concat([
      fromGate(101, Buffer.concat([u32(10, 11, 1), Buffer.from([1])])),
      fromGate(103, Buffer.concat([Buffer.from(id), u32(4, 2)])),
      fromGate(104, Buffer.concat([Buffer.from(id), u32(4, 0)])),
      fromGate(105, Buffer.concat([u32(1), Buffer.from(id), u32(3, 9, 1)])),
      fromGate(106, Buffer.from(id)),
    ]);
    const expected = [
      { type: 'hello', pid: 10, keeperPid: 11, version: 1, tookOver: true },
      { type: 'need', id, first: 4, count: 2 },
      { type: 'written', id, chunk: 4, errno: 0 },
      { type: 'listed', blobs: [{ id, present: 3, total: 9, waiting: 1 }] },
      { type: 'detached', id },
    ];
    for (const split of [1, 3, 7, stream.length]) {
      const decoder = new GateDecoder();
      const out = [];
      for (let i = 0; i < stream.length; i += split) out.push(...decoder.push(stream.subarray(i, i + split)));
      expect(out).toEqual(expected);
    }
  });
});

describe('FillQueue', () => {
  async function run(jobs: FillJob[], opts: { concurrency: number; prefetchConcurrency: number; maxRunChunks: number }): Promise<FillJob[]> {
    const limits = { maxRunBytes: opts.maxRunChunks, maxPrefetchRunBytes: opts.maxRunChunks, chunkBytesOf: () => 1 };
    const ran: FillJob[] = [];
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const q = new FillQueue({ concurrency: opts.concurrency, prefetchConcurrency: opts.prefetchConcurrency, ...limits, run: async (job) => {
      ran.push(job);
      await gate;
    } });
    for (const j of jobs) q.push(j);
    release();
    await q.idle();
    return ran;
  }

  it('merges queued runs of one layer that touch, up to the run cap, and keeps layers apart', async () => {
    // One slot: the first job runs alone; the rest queue and are merged when taken.
    const ran = await run(
      [
        { hex: 'a', first: 0, count: 1, demand: true },
        { hex: 'a', first: 5, count: 1, demand: true },
        { hex: 'b', first: 6, count: 1, demand: true },
        { hex: 'a', first: 6, count: 2, demand: false },
        { hex: 'a', first: 4, count: 1, demand: true },
        { hex: 'a', first: 20, count: 1, demand: true },
      ],
      { concurrency: 1, prefetchConcurrency: 1, maxRunChunks: 8 },
    );
    expect(ran).toEqual([
      { hex: 'a', first: 0, count: 1, demand: true },
      { hex: 'a', first: 4, count: 4, demand: true },
      { hex: 'b', first: 6, count: 1, demand: true },
      { hex: 'a', first: 20, count: 1, demand: true },
    ]);
  });

  it('serves reads before prefetches', async () => {
    const ran = await run(
      [
        { hex: 'a', first: 0, count: 1, demand: true },
        { hex: 'a', first: 30, count: 1, demand: false },
        { hex: 'a', first: 40, count: 1, demand: false },
        { hex: 'b', first: 1, count: 1, demand: true },
      ],
      { concurrency: 1, prefetchConcurrency: 1, maxRunChunks: 4 },
    );
    expect(ran.map((j) => `${j.hex}${j.first}`)).toEqual(['a0', 'b1', 'a30', 'a40']);
  });
});

import { describe, expect, it } from 'vitest';
import { Frame, FrameDecoder, MAX_FRAME_BYTES, encodeAttach, encodeSignal, encodeSpawn, frame } from './protocol.ts';

describe('init protocol', () => {
  it('lays a spawn out as rollbox-init.c parses it', () => {
    const bytes = encodeSpawn({ argv: ['sh', '-c', 'echo é'], env: { A: '1' }, cwd: '/work', slot: 's0', hasStdin: true, stdoutCapBytes: 1024, stderrCapBytes: 2048, oomScoreAdj: 500 });
    expect(bytes[0]).toBe(Frame.spawn);
    expect(bytes.readUInt32LE(4)).toBe(bytes.length - 8);
    const p = bytes.subarray(8);
    expect([p.readUInt32LE(0), p.readUInt32LE(4), p.readUInt32LE(8), p.readInt32LE(12), p.readUInt32LE(16), p.readUInt32LE(20)]).toEqual([1, 1024, 2048, 500, 3, 1]);
    expect(p.subarray(24).toString('utf8').split('\0')).toEqual(['s0', '/work', 'sh', '-c', 'echo é', 'A=1', '']);
  });

  it('sets the user flag and puts the user after the env strings', () => {
    const p = encodeSpawn({ argv: ['id'], env: { A: '1', B: '2' }, cwd: '/', user: 'alice:2000', slot: '', hasStdin: false, stdoutCapBytes: 1, stderrCapBytes: 1, oomScoreAdj: 0 }).subarray(8);
    expect([p.readUInt32LE(0), p.readUInt32LE(16), p.readUInt32LE(20)]).toEqual([2, 1, 2]);
    expect(p.subarray(24).toString('utf8').split('\0')).toEqual(['', '/', 'id', 'A=1', 'B=2', 'alice:2000', '']);
    const withStdin = encodeSpawn({ argv: ['id'], env: {}, cwd: '/', user: '0', slot: 's1', hasStdin: true, stdoutCapBytes: 1, stderrCapBytes: 1, oomScoreAdj: 0 }).subarray(8);
    expect(withStdin.readUInt32LE(0)).toBe(3);
    expect(withStdin.subarray(24).toString('utf8').split('\0')).toEqual(['s1', '/', 'id', '0', '']);
  });

  it('puts a durable command\'s id after the user, then its grace as a u32', () => {
    const p = encodeSpawn({ argv: ['id'], env: {}, cwd: '/', user: 'bob', slot: 's2', hasStdin: false, stdoutCapBytes: 1, stderrCapBytes: 1, oomScoreAdj: 0, durable: { commandId: 'turn-7', graceMs: 60_000 } }).subarray(8);
    expect(p.readUInt32LE(0)).toBe(2 | 4);
    expect(p.subarray(24, -4).toString('utf8').split('\0')).toEqual(['s2', '/', 'id', 'bob', 'turn-7', '']);
    expect(p.readUInt32LE(p.length - 4)).toBe(60_000);
  });

  it('lays out attach (u64 offset, id, NUL) and signal (u32) frames', () => {
    const a = encodeAttach('cmd-1', 2 ** 33 + 5);
    expect(a[0]).toBe(Frame.attach);
    expect(a.readUInt32LE(4)).toBe(8 + 6);
    expect(a.readBigUInt64LE(8)).toBe(2n ** 33n + 5n);
    expect(a.subarray(16).toString('utf8')).toBe('cmd-1\0');
    const s = encodeSignal(15);
    expect([s[0], s.readUInt32LE(4), s.readUInt32LE(8)]).toEqual([Frame.signal, 4, 15]);
  });

  it('splits a byte stream into frames however it arrives', () => {
    const stream = Buffer.concat([frame(Frame.stdout, Buffer.from('hello')), frame(Frame.truncated, Buffer.from([0])), frame(Frame.exit, Buffer.alloc(8))]);
    for (const step of [1, 3, 8, 13, stream.length]) {
      const seen: [number, string][] = [];
      const decoder = new FrameDecoder();
      for (let off = 0; off < stream.length; off += step) decoder.push(stream.subarray(off, off + step), (type, payload) => seen.push([type, payload.toString('hex')]));
      expect(seen).toEqual([
        [Frame.stdout, Buffer.from('hello').toString('hex')],
        [Frame.truncated, '00'],
        [Frame.exit, '0000000000000000'],
      ]);
    }
  });

  it('refuses a frame larger than any the init sends', () => {
    const header = Buffer.alloc(8);
    header[0] = Frame.stdout;
    header.writeUInt32LE(MAX_FRAME_BYTES + 1, 4);
    expect(() => new FrameDecoder().push(header, () => {})).toThrow(/frame of/);
  });
});

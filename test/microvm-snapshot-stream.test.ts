import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RollboxError } from '../src/api/index.ts';
import { extractInThread, LAYER_CHUNK_BYTES } from '../src/layers/index.ts';
import { MuxKind, muxFrame, openVmChannel, type VmChannel } from '../src/workers/microvm/index.ts';
import { snapshotVm } from '../src/workers/microvm/snapshot.ts';
import { tarOf } from './support/tar.ts';

/**
 * The host's side of a microVM snapshot against what a broken or hostile guest could
 * send, which the real guest's trusted side never does (test/microvm-snapshot.test.ts
 * runs the real one): a stand-in for the guest's multiplexer on the socket QEMU's
 * chardev would give, speaking the channel's frames, and the real channel, reader and
 * EROFS writer on the host. Every refusal is coded, cancels the guest's side and leaves
 * no file behind.
 */
let work: string;
let seq = 0;

beforeAll(() => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-vmsnap-stream-'));
});
afterAll(() => fs.rmSync(work, { recursive: true, force: true }));

interface Request {
  id: number;
  body: Buffer;
  send(kind: number, payload?: Buffer): void;
}

/** A guest: answers pings; each snapshot request (body whole) goes to `answer`; `cancelled` lists the requests the host closed. */
async function fakeGuest(answer: (req: Request) => void): Promise<{ channel: VmChannel; cancelled: number[]; requests: Request[]; close(): Promise<void> }> {
  const dir = path.join(work, `vm-${seq++}`);
  fs.mkdirSync(dir);
  const cancelled: number[] = [];
  const requests: Request[] = [];
  const sockets: net.Socket[] = [];
  const server = net.createServer((socket) => {
    sockets.push(socket);
    let pending = Buffer.alloc(0);
    const bodies = new Map<number, Buffer[]>();
    socket.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 12 && pending.length >= 12 + pending.readUInt32LE(8)) {
        const id = pending.readUInt32LE(0);
        const kind = pending[4]!;
        const payload = pending.subarray(12, 12 + pending.readUInt32LE(8));
        pending = pending.subarray(12 + payload.length);
        if (kind === MuxKind.ping) socket.write(muxFrame(0, MuxKind.pong));
        else if (kind === MuxKind.snapshot) bodies.set(id, []);
        else if (kind === MuxKind.data) bodies.get(id)?.push(Buffer.from(payload));
        else if (kind === MuxKind.close) cancelled.push(id);
        else if (kind === MuxKind.eof && bodies.has(id)) {
          const req: Request = { id, body: Buffer.concat(bodies.get(id)!), send: (k, p) => void (socket.destroyed || socket.write(muxFrame(id, k, p))) };
          requests.push(req);
          answer(req);
        }
      }
    });
    socket.on('error', () => {});
  });
  const agentSocket = path.join(dir, 'agent.sock');
  await new Promise<void>((resolve) => server.listen(agentSocket, resolve));
  const channel = await openVmChannel(agentSocket, path.join(dir, 'init.sock'), { connectTimeoutMs: 2000 });
  await channel.ready(2000);
  return {
    channel,
    cancelled,
    requests,
    async close() {
      await channel.close();
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** The guest's result record: status, entries, skipped, frozen µs, tar bytes, message. */
function result(status: number, frozenUs = 0, message = ''): Buffer {
  const r = Buffer.alloc(28);
  r.writeUInt32LE(status, 0);
  r.writeBigUInt64LE(BigInt(frozenUs), 12);
  return Buffer.concat([r, Buffer.from(message)]);
}


/** Data frames of at most 64 KiB, as the guest's multiplexer sends them. */
function sendData(req: Request, bytes: Buffer): void {
  for (let o = 0; o < bytes.length; o += 65536) req.send(MuxKind.data, bytes.subarray(o, o + 65536));
}

async function snap(guest: Awaited<ReturnType<typeof fakeGuest>>, limits: Partial<{ maxBytes: number; idleTimeoutMs: number; maxEntries: number }> = {}) {
  const dir = path.join(work, `out-${seq++}`);
  fs.mkdirSync(dir);
  const files = { metaPath: path.join(dir, 'layer.meta'), blobPath: path.join(dir, 'layer.blob'), chunkSizeBytes: LAYER_CHUNK_BYTES };
  const removeFiles = async () => {
    for (const f of [files.metaPath, files.blobPath]) fs.rmSync(f, { force: true });
  };
  const outcome = await snapshotVm(guest.channel, files, { excludePaths: ['/answers'], held: false, removeFiles }, { maxBytes: 1 << 20, maxEntries: 100, idleTimeoutMs: 5000, ...limits }, extractInThread).catch((err: unknown) => err);
  return { outcome, left: fs.readdirSync(dir) };
}

const UPPER = () =>
  tarOf([
    { name: './', type: 'directory', mode: 0o755 },
    { name: 'root/', type: 'directory', mode: 0o700, pax: { 'SCHILY.xattr.trusted.overlay.opaque': 'y' } },
    { name: 'root/file', content: 'data\n' },
    { name: 'root/.wh.plain', content: 'a plain name\n' },
    { name: 'gone', type: 'character-device', devmajor: 0, devminor: 0, mode: 0 },
    { name: 'answers/ref', content: '42\n' },
  ]);

describe('a microVM snapshot stream, from a stand-in guest', () => {
  it('is written into a split layer; a "changed" answer is asked again frozen throughout, the frozen times added', async () => {
    const tar = await UPPER();
    const guest = await fakeGuest((req) => {
      const mode = req.body.readUInt32LE(0);
      expect(req.body.subarray(8).toString()).toBe('answers\0');
      if (mode === 1) {
        sendData(req, tar.subarray(0, 700));
        req.send(MuxKind.result, result(1, 40_000));
      } else {
        sendData(req, tar);
        req.send(MuxKind.result, result(0, 250_000));
      }
      req.send(MuxKind.close);
    });
    const { outcome, left } = await snap(guest);
    expect(outcome).toMatchObject({ frozenMs: 290 });
    expect(Buffer.isBuffer((outcome as { table: Buffer }).table)).toBe(true);
    expect(left.sort()).toEqual(['layer.blob', 'layer.meta']);
    expect(guest.requests.map((r) => r.body.readUInt32LE(0))).toEqual([1, 2]);
    await guest.close();
  });

  it('refuses garbage, entries no layer may hold, a stream cut short, a silent guest and one past its cap: coded, cancelled, nothing left', async () => {
    const device = await tarOf([{ name: 'dev', type: 'character-device', devmajor: 1, devminor: 3 }]);
    const trustedXattr = await tarOf([{ name: 'f', content: 'x', pax: { 'SCHILY.xattr.trusted.overlay.redirect': '/elsewhere' } }]);
    const big = await tarOf([{ name: 'big', content: randomBytes(2 << 20) }]);
    const within = await tarOf([{ name: 'within', content: randomBytes(500_000) }]);
    // The guest still streaming (no result yet) unless said: the host's refusal must stop it.
    const cases: [string, (req: Request) => void, string, RegExp][] = [
      ['garbage', (req) => sendData(req, randomBytes(300_000)), 'snapshot_failed', /refused/],
      ['garbage, then its result', (req) => (sendData(req, randomBytes(300_000)), req.send(MuxKind.result, result(0))), 'snapshot_failed', /refused/],
      ['a device node', (req) => sendData(req, device), 'snapshot_failed', /device node/],
      ['a trusted.* xattr', (req) => sendData(req, trustedXattr), 'snapshot_failed', /trusted/],
      ['cut short', (req) => (sendData(req, within.subarray(0, 100_000)), req.send(MuxKind.close)), 'snapshot_failed', /without a result/],
      ['silent', (req) => sendData(req, within.subarray(0, 100_000)), 'snapshot_failed', /sent nothing for 400 ms/],
      ['past its cap', (req) => sendData(req, big), 'payload_too_large', /exceed/],
      ['a guest that could not pack', (req) => req.send(MuxKind.result, result(2, 0, '/root: the name is not UTF-8')), 'snapshot_failed', /not UTF-8/],
      ['too many entries', (req) => req.send(MuxKind.result, result(3, 0, 'the writable layer has more than 100 entries')), 'payload_too_large', /more than 100 entries/],
    ];
    const endsItself = ['garbage, then its result', 'cut short', 'a guest that could not pack', 'too many entries'];
    for (const [what, answer, code, message] of cases) {
      const guest = await fakeGuest(answer);
      const { outcome, left } = await snap(guest, { idleTimeoutMs: 400 });
      expect(outcome, what).toBeInstanceOf(RollboxError);
      expect((outcome as RollboxError).code, `${what}: ${(outcome as Error).message}`).toBe(code);
      expect((outcome as Error).message, what).toMatch(message);
      expect(left, what).toEqual([]);
      // The guest's side is told to stop (its packer killed, the sandbox thawed) unless it ended the request itself.
      if (!endsItself.includes(what)) await expect.poll(() => guest.cancelled, { timeout: 2000 }).toContain(guest.requests[0]!.id);
      await guest.close();
    }
  });
});

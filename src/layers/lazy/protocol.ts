/**
 * The worker's side of rollbox-gate's protocol (see src/layers/gate/rollbox-gate.c): frames
 * of a u32 little-endian length (of what follows), a type byte and a body. Blob ids are the
 * layer's 64 hex digits.
 */

export const GATE_PROTOCOL_VERSION = 1;
const ID_LEN = 64;

const ToGate = { Attach: 1, Detach: 2, Data: 3, Fail: 4, List: 5, Shutdown: 6 } as const;

export type FromGate =
  | { type: 'hello'; pid: number; keeperPid: number; version: number; tookOver: boolean }
  | { type: 'attached'; id: string; present: number; total: number; errno: number }
  | { type: 'need'; id: string; first: number; count: number }
  | { type: 'written'; id: string; chunk: number; errno: number }
  | { type: 'listed'; blobs: { id: string; present: number; total: number; waiting: number }[] }
  | { type: 'detached'; id: string }
  | { type: 'busy'; attached: number };

function frame(type: number, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32LE(body.length + 1, 0);
  head.writeUInt8(type, 4);
  return Buffer.concat([head, body]);
}

function idBytes(id: string): Buffer {
  if (!/^[0-9a-f]{64}$/.test(id)) throw new Error(`not a blob id: ${id}`);
  return Buffer.from(id, 'latin1');
}

function u32s(...values: number[]): Buffer {
  const b = Buffer.alloc(4 * values.length);
  values.forEach((v, i) => b.writeUInt32LE(v, 4 * i));
  return b;
}

function pathBytes(p: string): Buffer {
  const bytes = Buffer.from(p);
  if (bytes.length >= 4096 || p.includes('\0')) throw new Error(`path too long for the gate: ${p.slice(0, 100)}`);
  const len = Buffer.alloc(2);
  len.writeUInt16LE(bytes.length, 0);
  return Buffer.concat([len, bytes]);
}

export const encode = {
  attach(id: string, sizeBytes: number, chunkSizeBytes: number, dataPath: string, mapPath: string): Buffer {
    const size = Buffer.alloc(8);
    size.writeBigUInt64LE(BigInt(sizeBytes), 0);
    return frame(ToGate.Attach, Buffer.concat([idBytes(id), size, u32s(chunkSizeBytes), pathBytes(dataPath), pathBytes(mapPath)]));
  },
  detach: (id: string): Buffer => frame(ToGate.Detach, idBytes(id)),
  /** A chunk's bytes (the head; the data follows as its own buffer, not copied). */
  dataHead(id: string, chunk: number, bytes: number): Buffer {
    const head = Buffer.alloc(5);
    head.writeUInt32LE(1 + ID_LEN + 4 + bytes, 0);
    head.writeUInt8(ToGate.Data, 4);
    return Buffer.concat([head, idBytes(id), u32s(chunk)]);
  },
  fail: (id: string, first: number, count: number, errno: number): Buffer => frame(ToGate.Fail, Buffer.concat([idBytes(id), u32s(first, count, errno)])),
  list: (): Buffer => frame(ToGate.List, Buffer.alloc(0)),
  shutdown: (): Buffer => frame(ToGate.Shutdown, Buffer.alloc(0)),
};

/** Splits a byte stream from the gate into messages (feed it what arrives, in order). */
export class GateDecoder {
  private pending: Buffer = Buffer.alloc(0);

  push(chunk: Buffer): FromGate[] {
    this.pending = this.pending.length ? Buffer.concat([this.pending, chunk]) : chunk;
    const out: FromGate[] = [];
    while (this.pending.length >= 4) {
      const len = this.pending.readUInt32LE(0);
      if (this.pending.length < 4 + len) break;
      const msg = this.pending.subarray(4, 4 + len);
      this.pending = this.pending.subarray(4 + len);
      const decoded = decodeOne(msg);
      if (decoded) out.push(decoded);
    }
    return out;
  }
}

function decodeOne(msg: Buffer): FromGate | undefined {
  const type = msg.readUInt8(0);
  const body = msg.subarray(1);
  const id = (): string => body.subarray(0, ID_LEN).toString('latin1');
  const at = (i: number): number => body.readUInt32LE(ID_LEN + 4 * i);
  switch (type) {
    case 101:
      return { type: 'hello', pid: body.readUInt32LE(0), keeperPid: body.readUInt32LE(4), version: body.readUInt32LE(8), tookOver: body.readUInt8(12) === 1 };
    case 102:
      return { type: 'attached', id: id(), present: at(0), total: at(1), errno: at(2) };
    case 103:
      return { type: 'need', id: id(), first: at(0), count: at(1) };
    case 104:
      return { type: 'written', id: id(), chunk: at(0), errno: at(1) };
    case 105: {
      const n = body.readUInt32LE(0);
      const blobs = [];
      for (let i = 0, off = 4; i < n; i++, off += ID_LEN + 12) {
        blobs.push({ id: body.subarray(off, off + ID_LEN).toString('latin1'), present: body.readUInt32LE(off + ID_LEN), total: body.readUInt32LE(off + ID_LEN + 4), waiting: body.readUInt32LE(off + ID_LEN + 8) });
      }
      return { type: 'listed', blobs };
    }
    case 106:
      return { type: 'detached', id: id() };
    case 107:
      return { type: 'busy', attached: body.readUInt32LE(0) };
    default:
      return undefined;
  }
}

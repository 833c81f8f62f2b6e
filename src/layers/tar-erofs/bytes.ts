import { writeSync } from 'node:fs';
import { RollboxError } from '../../api/index.ts';

/** The pieces of an EROFS metadata image that are plain bytes (image.ts lays them out). */

export const BLOCK_BYTES = 4096;
export const XATTR_HEADER_BYTES = 12;
/** Longest prefix first: the index EROFS stores for a name, and the rest of the name. */
const XATTR_PREFIXES: [string, number][] = [
  ['system.posix_acl_access', 2],
  ['system.posix_acl_default', 3],
  ['user.', 1],
  ['trusted.', 4],
  ['security.', 6],
];

/**
 * Bytes written front to back at rising positions (gaps stay holes, read as zeros),
 * gathered into writes of about a MiB.
 */
export class SeqWriter {
  private readonly buf = Buffer.alloc(1 << 20);
  private used = 0;

  constructor(
    private readonly fd: number,
    private start: number,
  ) {}

  write(position: number, bytes: Buffer): void {
    const end = this.start + this.used;
    if (position < end) throw new RollboxError('internal', `EROFS image writer went back from ${end} to ${position}`);
    if (position - end + bytes.length > this.buf.length - this.used) {
      this.flush();
      this.start = position;
    } else {
      this.buf.fill(0, this.used, this.used + position - end);
      this.used += position - end;
    }
    if (bytes.length > this.buf.length) {
      writeAll(this.fd, bytes, position);
      this.start = position + bytes.length;
      return;
    }
    bytes.copy(this.buf, this.used);
    this.used += bytes.length;
  }

  flush(): void {
    writeAll(this.fd, this.buf.subarray(0, this.used), this.start);
    this.start += this.used;
    this.used = 0;
  }
}

function writeAll(fd: number, bytes: Buffer, position: number): void {
  for (let done = 0; done < bytes.length; ) done += writeSync(fd, bytes, done, bytes.length - done, position + done);
}

export function splitBlocks(bytes: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0; at < bytes.length; at += BLOCK_BYTES) out.push(bytes.subarray(at, at + BLOCK_BYTES));
  return out;
}

export function xattrAreaBytes(xattrs: Map<string, Buffer> | undefined): number {
  return xattrs && xattrs.size > 0 ? xattrArea(xattrs).length : 0;
}

/** The inline xattr area: a header, then each entry (name index, the rest of the name, the value) padded to 4 bytes. */
export function xattrArea(xattrs: Map<string, Buffer> | undefined): Buffer {
  if (!xattrs || xattrs.size === 0) return Buffer.alloc(0);
  const parts: Buffer[] = [Buffer.alloc(XATTR_HEADER_BYTES)];
  for (const [name, value] of xattrs) {
    const prefix = XATTR_PREFIXES.find(([p]) => name.startsWith(p));
    if (!prefix) throw new RollboxError('internal', `xattr ${name} has no EROFS name index`);
    const suffix = Buffer.from(name.slice(prefix[0].length), 'utf8');
    const entry = Buffer.alloc(alignUp(4 + suffix.length + value.length, 4));
    entry.writeUInt8(suffix.length, 0);
    entry.writeUInt8(prefix[1], 1);
    entry.writeUInt16LE(value.length, 2);
    suffix.copy(entry, 4);
    value.copy(entry, 4 + suffix.length);
    parts.push(entry);
  }
  return Buffer.concat(parts);
}

export function alignUp(n: number, to: number): number {
  return Math.ceil(n / to) * to;
}

import type tar from 'tar-stream';
import { RollboxError } from '../api/index.ts';
import { tarLimits, type ExtractLimits } from './tar-entries.ts';

/**
 * Each entry of a TarPushReader: a sink for its contents (called with each piece, in order;
 * a piece is only valid during the call), or undefined to skip them.
 */
export type TarPushVisitor = (header: tar.Header) => ((piece: Buffer) => void) | undefined;

const BLOCK = 512;
/** As tar-stream: a pax or GNU long-name record larger than this is refused. */
const MAX_LONG_HEADER_BYTES = 4 * 1024 * 1024;
const USTAR_MAGIC = Buffer.from('ustar\0', 'latin1');
const GNU_MAGIC = Buffer.from('ustar ', 'latin1');
const GNU_VERSION = Buffer.from(' \0', 'latin1');
/** Entry types, and the records tar-stream reads itself (pax and GNU long names) and never hands on. */
type RecordType = tar.Header['type'] | 'pax-header' | 'pax-global-header' | 'gnu-long-link-path' | 'gnu-long-path';
/** A header as read; `type` null for a typeflag tar-stream does not know either (read as a file, as there). */
type RawHeader = Omit<tar.Header, 'type' | 'linkname'> & { type: RecordType | null; linkname: string | null };
const TYPES: Record<number, RecordType> = { 0: 'file', 1: 'link', 2: 'symlink', 3: 'character-device', 4: 'block-device', 5: 'directory', 6: 'fifo', 7: 'contiguous-file', 72: 'pax-header', 55: 'pax-global-header', 27: 'gnu-long-link-path', 28: 'gnu-long-path', 30: 'gnu-long-path' };

const padding = (size: number): number => (BLOCK - (size % BLOCK)) % BLOCK;
const malformed = (why: string): RollboxError => new RollboxError('invalid_layer', `malformed tar: ${why}`);

/**
 * A tar read synchronously, piece by piece as it is pushed: no stream and no promise per
 * entry, for the EROFS writer (src/layers/tar-erofs), whose every step is synchronous. It
 * decodes as tar-stream 3 does for readTarEntries (the same headers, pax and GNU long names,
 * the same refusals) and enforces the same ExtractLimits: entries, content bytes, and tar
 * metadata beyond the contents. Errors are RollboxErrors (`invalid_layer`, `payload_too_large`).
 */
export class TarPushReader {
  private readonly partial = Buffer.alloc(BLOCK);
  private partialBytes = 0;
  /** A pax or GNU long-name record being gathered. */
  private long: { type: RecordType; parts: Buffer[]; missing: number } | undefined;
  private sink: ((piece: Buffer) => void) | undefined;
  private contentMissing = 0;
  /** Bytes to pass over: a skipped entry's contents, and padding. */
  private skipMissing = 0;
  private pax: Record<string, string> | undefined;
  private paxGlobal: Record<string, string> | undefined;
  private gnuLongPath: string | undefined;
  private gnuLongLinkPath: string | undefined;
  private rawBytes = 0;
  private contentBytes = 0;
  private entries = 0;

  constructor(
    private readonly limits: ExtractLimits,
    private readonly onTarChunk: ((chunk: Buffer) => void) | undefined,
    private readonly visit: TarPushVisitor,
  ) {}

  push(chunk: Buffer): void {
    this.rawBytes += chunk.length;
    this.onTarChunk?.(chunk);
    let at = 0;
    while (at < chunk.length) {
      const left = chunk.length - at;
      if (this.contentMissing > 0) {
        const n = Math.min(left, this.contentMissing);
        this.contentMissing -= n;
        if (this.sink) {
          this.contentBytes += n;
          this.sink(chunk.subarray(at, at + n));
        }
        at += n;
        if (this.contentMissing === 0) this.sink = undefined;
      } else if (this.skipMissing > 0) {
        const n = Math.min(left, this.skipMissing);
        this.skipMissing -= n;
        at += n;
      } else if (this.long) {
        const n = Math.min(left, this.long.missing);
        this.long.parts.push(Buffer.from(chunk.subarray(at, at + n)));
        this.long.missing -= n;
        at += n;
        if (this.long.missing === 0) this.endLongHeader();
      } else if (this.partialBytes === 0 && left >= BLOCK) {
        this.header(chunk.subarray(at, at + BLOCK));
        at += BLOCK;
      } else {
        const n = Math.min(left, BLOCK - this.partialBytes);
        chunk.copy(this.partial, this.partialBytes, at, at + n);
        this.partialBytes += n;
        at += n;
        if (this.partialBytes === BLOCK) {
          this.partialBytes = 0;
          this.header(this.partial);
        }
      }
    }
    tarLimits.checkMetadata(this.rawBytes, this.contentBytes, this.entries);
  }

  /** The input ended: refuses a tar cut short. */
  end(): void {
    if (this.contentMissing > 0 || this.skipMissing > 0 || this.long || this.partialBytes > 0) throw malformed('Unexpected end of data');
  }

  private header(block: Buffer): void {
    const header = decodeHeader(block);
    if (!header) return; // a zero block (the end marker): tar-stream reads on
    switch (header.type) {
      case 'gnu-long-path':
      case 'gnu-long-link-path':
      case 'pax-global-header':
      case 'pax-header':
        if (!(header.size! >= 0)) throw malformed('Invalid header');
        if (header.size! > MAX_LONG_HEADER_BYTES) throw malformed('Header exceeds max size');
        this.long = { type: header.type, parts: [], missing: header.size! };
        if (header.size === 0) this.endLongHeader();
        return;
    }
    if (this.gnuLongPath !== undefined) header.name = this.gnuLongPath;
    if (this.gnuLongLinkPath !== undefined) header.linkname = this.gnuLongLinkPath;
    this.gnuLongPath = this.gnuLongLinkPath = undefined;
    if (this.pax) {
      if (this.pax.path) header.name = this.pax.path;
      if (this.pax.linkpath) header.linkname = this.pax.linkpath;
      if (this.pax.size) header.size = parseInt(this.pax.size, 10);
      header.pax = this.pax;
      this.pax = undefined;
    }
    const size = header.size!;
    if (!(size >= 0)) throw malformed('Invalid header');
    this.entries++;
    tarLimits.checkEntries(this.limits, this.entries);
    // As tar-stream: a directory's size is never read as contents.
    const contents = header.type === 'directory' ? 0 : size;
    const sink = this.visit(header as tar.Header);
    if (contents === 0) return;
    if (sink) tarLimits.checkContents(this.limits, this.contentBytes + contents);
    this.sink = sink;
    this.contentMissing = contents;
    this.skipMissing = padding(contents);
  }

  private endLongHeader(): void {
    const { type, parts } = this.long!;
    this.long = undefined;
    const record = Buffer.concat(parts);
    this.skipMissing = padding(record.length);
    if (type === 'gnu-long-path') this.gnuLongPath = cString(record, 0, record.length);
    else if (type === 'gnu-long-link-path') this.gnuLongLinkPath = cString(record, 0, record.length);
    else if (type === 'pax-global-header') this.paxGlobal = decodePax(record);
    else this.pax = { ...this.paxGlobal, ...decodePax(record) };
  }
}

/** A NUL-terminated string of at most `length` bytes at `offset`. */
function cString(block: Buffer, offset: number, length: number): string {
  const end = block.indexOf(0, offset);
  return block.toString('utf8', offset, end < 0 || end > offset + length ? offset + length : end);
}

/** An octal field (leading spaces and NULs allowed, ended by a space or NUL), or base-256 when its first byte has the high bit (NaN: neither). */
function numeric(block: Buffer, offset: number, length: number): number {
  if (block[offset]! & 0x80) {
    const positive = block[offset] === 0x80;
    if (!positive && block[offset] !== 0xff) return NaN;
    let sum = 0;
    for (let i = offset + length - 1, scale = 1; i > offset; i--, scale *= 256) sum += (positive ? block[i]! : 0xff - block[i]!) * scale;
    return positive ? sum : -sum;
  }
  let at = offset;
  const fieldEnd = offset + length;
  while (at < fieldEnd && block[at] === 0x20) at++;
  let end = block.indexOf(0x20, at);
  if (end < 0 || end > fieldEnd) end = fieldEnd;
  while (at < end && block[at] === 0) at++;
  return end === at ? 0 : parseInt(block.toString('latin1', at, end), 8);
}

function decodeHeader(block: Buffer): RawHeader | null {
  let sum = 8 * 0x20;
  for (let i = 0; i < 148; i++) sum += block[i]!;
  for (let i = 156; i < BLOCK; i++) sum += block[i]!;
  if (sum === 8 * 0x20) return null;
  if (sum !== numeric(block, 148, 8)) throw malformed('Invalid tar header. Maybe the tar is corrupted or it needs to be gunzipped?');
  let name = cString(block, 0, 100);
  if (block.compare(USTAR_MAGIC, 0, 6, 257, 263) === 0) {
    if (block[345]) name = `${cString(block, 345, 155)}/${name}`;
  } else if (!(block.compare(GNU_MAGIC, 0, 6, 257, 263) === 0 && block.compare(GNU_VERSION, 0, 2, 263, 265) === 0)) {
    throw malformed('Invalid tar header: unknown format.');
  }
  // tar-stream 3 computes the type before its trailing-slash rule for old tars, so a `0` entry
  // named `dir/` stays a file there; it does here too.
  const flag = block[156] === 0 ? 0 : block[156]! - 0x30;
  const mode = numeric(block, 100, 8);
  const uid = numeric(block, 108, 8);
  const gid = numeric(block, 116, 8);
  const mtimeSeconds = numeric(block, 136, 12);
  if ([mode, uid, gid, mtimeSeconds].some(Number.isNaN)) throw malformed('Invalid header');
  return {
    name,
    mode,
    uid,
    gid,
    size: numeric(block, 124, 12),
    mtime: new Date(1000 * mtimeSeconds),
    type: TYPES[flag] ?? null,
    linkname: block[157] === 0 ? null : cString(block, 157, 100),
    uname: cString(block, 265, 32),
    gname: cString(block, 297, 32),
    devmajor: numeric(block, 329, 8),
    devminor: numeric(block, 337, 8),
    pax: null,
  };
}

/** pax records: `LEN key=value\n`, as tar-stream reads them (a malformed record ends the reading). */
function decodePax(record: Buffer): Record<string, string> {
  const result: Record<string, string> = {};
  let rest = record;
  while (rest.length) {
    let i = 0;
    while (i < rest.length && rest[i] !== 0x20) i++;
    const len = parseInt(rest.toString('utf8', 0, i), 10);
    if (!len) return result;
    const text = rest.toString('utf8', i + 1, len - 1);
    const eq = text.indexOf('=');
    if (eq === -1) return result;
    result[text.slice(0, eq)] = text.slice(eq + 1);
    rest = rest.subarray(len);
  }
  return result;
}

import { closeSync, ftruncateSync, openSync, readSync, writeSync } from 'node:fs';
import { RollboxError } from '../../api/index.ts';
import { EROFS_MAGIC, FEATURE_COMPAT_SB_CHKSUM, SUPER_OFFSET, crc32c } from '../erofs.ts';
import { BLOCK_BYTES, SeqWriter, XATTR_HEADER_BYTES, alignUp, splitBlocks, xattrArea, xattrAreaBytes } from './bytes.ts';
import { DOTDOT_ENTRY, DOT_ENTRY, KIND, type LayerTree } from './tree.ts';

/**
 * The EROFS metadata image of a layer tree whose file contents are in a separate data
 * blob (the image's one extra device), laid out as mkfs.erofs 1.5 lays out `--blobdev
 * --chunksize` images (checked against it in test/tar-erofs.test.ts): extended inodes,
 * file contents chunk-indexed into the blob, directories and symlink targets inline after
 * their inode where they fit, xattrs inline. Format: the kernel's fs/erofs/erofs_fs.h.
 * Written to its file as it is made (inodes in one front-to-back run, directory and
 * symlink blocks in another), so only the tree and a few columns per node are in memory.
 */

const BLOCK_BITS = 12;
const FEATURE_INCOMPAT_CHUNKED_FILE = 0x4;
const FEATURE_INCOMPAT_DEVICE_TABLE = 0x8;
const DEVICE_SLOT_BYTES = 128;
/** The device table right after the superblock; inodes after it. */
const DEVICE_TABLE_OFFSET = SUPER_OFFSET + 128;
const FIRST_INODE_OFFSET = DEVICE_TABLE_OFFSET + DEVICE_SLOT_BYTES;
const INODE_BYTES = 64; // erofs_inode_extended
const NID_BYTES = 32;
const NULL_ADDR = 0xffffffff;
const LAYOUT = { flatPlain: 0, flatInline: 2, chunkBased: 4 };
const CHUNK_FORMAT_INDEXES = 0x20;
const CHUNK_INDEX_BYTES = 8;
const DIRENT_BYTES = 12;
/** By node kind (tree.ts KIND): the dirent file type and the mode's type bits. */
const FILE_TYPE = [0, 2, 1, 7, 5, 3];
const S_IF = [0, 0o040000, 0o100000, 0o120000, 0o010000, 0o020000];

/** Writes the image of `tree` to `path` (a new file); answers its size. */
export function writeErofsMetaImage(tree: LayerTree, path: string, opts: { chunkSizeBytes: number }): number {
  const chunkBits = Math.log2(opts.chunkSizeBytes) - BLOCK_BITS;
  if (!Number.isInteger(chunkBits) || chunkBits < 0 || chunkBits > 31) throw new RollboxError('internal', `chunk size ${opts.chunkSizeBytes} is not a power of two of at least a block`);
  const { kind } = tree;
  const layout = new Layout(tree, opts.chunkSizeBytes);
  const fd = openSync(path, 'wx+', 0o600);
  try {
    const inodes = new SeqWriter(fd, 0);
    const blocks = new SeqWriter(fd, layout.firstDataBlock * BLOCK_BYTES);
    for (let i = 0; i < layout.count; i++) {
      const n = layout.order[i]!;
      const data = kind[n] === KIND.dir ? layout.direntBlocks(n) : kind[n] === KIND.symlink ? splitBlocks(tree.targetOf(n)) : [];
      const inline = layout.inline[n] === 1;
      data.forEach((block, k) => {
        if (!(inline && k === data.length - 1)) blocks.write((layout.rawBlock[n]! + k) * BLOCK_BYTES, block);
      });
      inodes.write(layout.nid[n]! * NID_BYTES, inodeBytes(tree, layout, n, chunkBits, inline ? data[data.length - 1] : undefined));
    }
    inodes.flush();
    blocks.flush();
    ftruncateSync(fd, layout.blockCount * BLOCK_BYTES);
    writeSuperblock(fd, { rootNid: layout.nid[0]!, inodes: layout.count, blocks: layout.blockCount });
  } finally {
    closeSync(fd);
  }
  return layout.blockCount * BLOCK_BYTES;
}

/** Where everything goes: inodes in breadth-first order (hard links share one), their nids and data blocks. */
class Layout {
  readonly order: Uint32Array;
  count = 0;
  readonly nid: Uint32Array;
  readonly rawBlock: Uint32Array;
  readonly inline: Uint8Array;
  private readonly ino: Uint32Array;
  private readonly nlink: Uint32Array;
  private readonly parent: Uint32Array;
  /** Each directory's entries (`.` and `..` among them) in name order: `sorted[sortedAt[dir] ...]`. */
  private readonly sorted: Uint32Array;
  private readonly sortedAt: Uint32Array;
  /** Each directory's entries, `.` and `..` among them. */
  private readonly entries: Uint32Array;
  /** Each directory's or symlink's data: how many blocks, and the bytes of the last. */
  private readonly dataBlocks: Uint32Array;
  private readonly tailBytes: Uint16Array;
  readonly firstDataBlock: number;
  readonly blockCount: number;

  constructor(
    private readonly tree: LayerTree,
    private readonly chunkSizeBytes: number,
  ) {
    const n = tree.nodeCount;
    this.order = new Uint32Array(n);
    this.ino = new Uint32Array(n);
    this.nlink = new Uint32Array(n);
    this.parent = new Uint32Array(n);
    this.sortedAt = new Uint32Array(n);
    // Every inode once, parents before children; link counts as a file system keeps them.
    this.entries = new Uint32Array(n);
    this.add(0, 0);
    let sortedLength = 0;
    for (let i = 0; i < this.count; i++) {
      const dir = this.order[i]!;
      if (tree.kind[dir] !== KIND.dir) continue;
      for (let e = tree.firstEntry[dir]!; e !== 0; e = tree.nextEntry[e]!) {
        const child = tree.entryNode[e]!;
        this.add(child, dir);
        if (tree.kind[child] === KIND.dir) this.nlink[dir]!++;
        this.entries[dir]!++;
      }
      this.entries[dir]! += 2;
      this.sortedAt[dir] = sortedLength;
      sortedLength += this.entries[dir]!;
    }
    this.sorted = new Uint32Array(sortedLength);
    const byName = (x: number, y: number): number => tree.arena.compare(tree.arena, tree.nameOffset[y]!, tree.nameOffset[y]! + tree.nameBytes[y]!, tree.nameOffset[x]!, tree.nameOffset[x]! + tree.nameBytes[x]!);
    for (let i = 0; i < this.count; i++) {
      const dir = this.order[i]!;
      if (tree.kind[dir] !== KIND.dir) continue;
      let at = this.sortedAt[dir]!;
      this.sorted[at++] = DOT_ENTRY;
      this.sorted[at++] = DOTDOT_ENTRY;
      for (let e = tree.firstEntry[dir]!; e !== 0; e = tree.nextEntry[e]!) this.sorted[at++] = e;
      this.sorted.subarray(this.sortedAt[dir]!, at).sort(byName);
    }

    // Sizes, then places: nids in one run, then the data blocks not inline.
    this.nid = new Uint32Array(n);
    this.inline = new Uint8Array(n);
    this.dataBlocks = new Uint32Array(n);
    this.tailBytes = new Uint16Array(n);
    let cursor = FIRST_INODE_OFFSET;
    for (let i = 0; i < this.count; i++) {
      const node = this.order[i]!;
      const head = INODE_BYTES + xattrAreaBytes(tree.xattrs.get(node));
      if (head > BLOCK_BYTES) throw new RollboxError('invalid_layer', `extended attributes of one file take ${head - INODE_BYTES} bytes; a layer allows at most ${BLOCK_BYTES - INODE_BYTES}`);
      const data = this.dataSize(node);
      this.dataBlocks[node] = data.blocks;
      this.tailBytes[node] = data.tail;
      // Inline only a partial last block, and only where it fits beside its inode.
      const inline = data.blocks > 0 && data.tail < BLOCK_BYTES && head + data.tail <= BLOCK_BYTES;
      this.inline[node] = inline ? 1 : 0;
      const inBlock = head + (inline ? data.tail : 0);
      cursor = alignUp(cursor, NID_BYTES);
      if ((cursor % BLOCK_BYTES) + inBlock > BLOCK_BYTES) cursor = alignUp(cursor, BLOCK_BYTES);
      this.nid[node] = cursor / NID_BYTES;
      cursor += inBlock;
      const chunks = this.chunksOf(node);
      if (chunks > 0) cursor = alignUp(cursor, CHUNK_INDEX_BYTES) + chunks * CHUNK_INDEX_BYTES;
    }
    if (this.nid[0]! > 0xffff) throw new RollboxError('internal', 'root inode out of the superblock field range');
    this.firstDataBlock = Math.ceil(cursor / BLOCK_BYTES);
    this.rawBlock = new Uint32Array(n).fill(NULL_ADDR);
    let nextBlock = this.firstDataBlock;
    for (let i = 0; i < this.count; i++) {
      const node = this.order[i]!;
      const whole = this.dataBlocks[node]! - this.inline[node]!;
      if (whole > 0) {
        this.rawBlock[node] = nextBlock;
        nextBlock += whole;
      }
    }
    this.blockCount = nextBlock;
  }

  inoOf(node: number): number {
    return this.ino[node]!;
  }

  nlinkOf(node: number): number {
    return this.nlink[node]!;
  }

  /** A directory's or symlink's size. */
  dataBytes(node: number): number {
    const blocks = this.dataBlocks[node]!;
    return blocks === 0 ? 0 : (blocks - 1) * BLOCK_BYTES + this.tailBytes[node]!;
  }

  chunksOf(node: number): number {
    return this.tree.kind[node] === KIND.file ? Math.ceil(this.tree.a[node]! / this.chunkSizeBytes) : 0;
  }

  /** A directory's blocks: entries in name order, packed greedily, every block but the last full size. */
  direntBlocks(dir: number): Buffer[] {
    const { tree } = this;
    const start = this.sortedAt[dir]!;
    const end = start + this.entries[dir]!;
    const out: Buffer[] = [];
    for (let e = start; e < end; ) {
      const first = e;
      let used = 0;
      while (e < end && used + DIRENT_BYTES + tree.nameBytes[this.sorted[e]!]! <= BLOCK_BYTES) used += DIRENT_BYTES + tree.nameBytes[this.sorted[e++]!]!;
      const block = Buffer.alloc(e === end ? used : BLOCK_BYTES);
      let nameOff = (e - first) * DIRENT_BYTES;
      for (let i = first; i < e; i++) {
        const entry = this.sorted[i]!;
        const node = entry === DOT_ENTRY ? dir : entry === DOTDOT_ENTRY ? this.parent[dir]! : tree.entryNode[entry]!;
        const at = (i - first) * DIRENT_BYTES;
        block.writeBigUInt64LE(BigInt(this.nid[node]!), at);
        block.writeUInt16LE(nameOff, at + 8);
        block.writeUInt8(FILE_TYPE[tree.kind[node]!]!, at + 10);
        tree.arena.copy(block, nameOff, tree.nameOffset[entry]!, tree.nameOffset[entry]! + tree.nameBytes[entry]!);
        nameOff += tree.nameBytes[entry]!;
      }
      out.push(block);
    }
    return out;
  }

  private add(node: number, parent: number): void {
    if (this.ino[node] !== 0) {
      this.nlink[node]!++;
      return;
    }
    this.order[this.count++] = node;
    this.ino[node] = this.count;
    this.nlink[node] = this.tree.kind[node] === KIND.dir ? 2 : 1;
    this.parent[node] = parent;
  }

  /** How many data blocks a directory or symlink has, and the bytes of the last. */
  private dataSize(node: number): { blocks: number; tail: number } {
    const { tree } = this;
    if (tree.kind[node] === KIND.symlink) {
      const length = tree.b[node]!;
      const blocks = Math.ceil(length / BLOCK_BYTES);
      return { blocks, tail: length - (blocks - 1) * BLOCK_BYTES };
    }
    if (tree.kind[node] !== KIND.dir) return { blocks: 0, tail: 0 };
    const start = this.sortedAt[node]!;
    const end = start + this.entries[node]!;
    let blocks = 1;
    let used = 0;
    for (let e = start; e < end; e++) {
      const need = DIRENT_BYTES + tree.nameBytes[this.sorted[e]!]!;
      if (used + need > BLOCK_BYTES) {
        blocks++;
        used = 0;
      }
      used += need;
    }
    return { blocks, tail: used };
  }
}

function inodeBytes(tree: LayerTree, layout: Layout, n: number, chunkBits: number, inlineTail: Buffer | undefined): Buffer {
  const kind = tree.kind[n]!;
  const xattrs = xattrArea(tree.xattrs.get(n));
  const chunks = layout.chunksOf(n);
  const head = INODE_BYTES + xattrs.length + (inlineTail?.length ?? 0);
  const bytes = Buffer.alloc(chunks > 0 ? alignUp(head, CHUNK_INDEX_BYTES) + chunks * CHUNK_INDEX_BYTES : head);
  const size = kind === KIND.file ? tree.a[n]! : layout.dataBytes(n);
  const format = kind === KIND.file ? (chunks > 0 ? LAYOUT.chunkBased : LAYOUT.flatPlain) : inlineTail ? LAYOUT.flatInline : LAYOUT.flatPlain;
  bytes.writeUInt16LE(1 | (format << 1), 0); // i_format: extended inode
  bytes.writeUInt16LE(xattrs.length === 0 ? 0 : (xattrs.length - XATTR_HEADER_BYTES) / 4 + 1, 2);
  bytes.writeUInt16LE(S_IF[kind]! | (kind === KIND.whiteout ? 0 : tree.mode[n]! & 0o7777), 4);
  bytes.writeBigUInt64LE(BigInt(size), 8);
  // i_u: the chunk format, a device number (0: whiteouts and FIFOs) or the first data block.
  const u = kind === KIND.file ? (chunks > 0 ? CHUNK_FORMAT_INDEXES | chunkBits : 0) : kind === KIND.dir || kind === KIND.symlink ? layout.rawBlock[n]! : 0;
  bytes.writeUInt32LE(u, 16);
  bytes.writeUInt32LE(layout.inoOf(n), 20);
  bytes.writeUInt32LE(tree.uid[n]!, 24);
  bytes.writeUInt32LE(tree.gid[n]!, 28);
  const mtimeMs = tree.mtimeMs[n]!;
  const sec = Math.floor(mtimeMs / 1000);
  bytes.writeBigInt64LE(BigInt(sec), 32);
  bytes.writeUInt32LE(Math.round((mtimeMs - sec * 1000) * 1e6), 40);
  bytes.writeUInt32LE(layout.nlinkOf(n), 44);
  xattrs.copy(bytes, INODE_BYTES);
  inlineTail?.copy(bytes, INODE_BYTES + xattrs.length);
  if (chunks > 0) {
    let pos = alignUp(head, CHUNK_INDEX_BYTES);
    const firstBlock = tree.b[n]! / BLOCK_BYTES;
    for (let c = 0; c < chunks; c++) {
      bytes.writeUInt16LE(0, pos); // advise
      bytes.writeUInt16LE(1, pos + 2); // device 1: the data blob
      bytes.writeUInt32LE(firstBlock + c * (1 << chunkBits), pos + 4);
      pos += CHUNK_INDEX_BYTES;
    }
  }
  return bytes;
}

/** The superblock, written last: its checksum covers the rest of the first block (the first inodes). */
function writeSuperblock(fd: number, s: { rootNid: number; inodes: number; blocks: number }): void {
  const sb = Buffer.alloc(BLOCK_BYTES - SUPER_OFFSET);
  readSync(fd, sb, 0, sb.length, SUPER_OFFSET);
  sb.writeUInt32LE(EROFS_MAGIC, 0x00);
  sb.writeUInt32LE(FEATURE_COMPAT_SB_CHKSUM, 0x08);
  sb.writeUInt8(BLOCK_BITS, 0x0c);
  sb.writeUInt16LE(s.rootNid, 0x0e);
  sb.writeBigUInt64LE(BigInt(s.inodes), 0x10);
  // build time 0, uuid 0, no volume name: the same tree gives the same bytes.
  sb.writeUInt32LE(s.blocks, 0x24);
  sb.writeUInt32LE(FEATURE_INCOMPAT_CHUNKED_FILE | FEATURE_INCOMPAT_DEVICE_TABLE, 0x50);
  sb.writeUInt16LE(1, 0x56); // extra_devices: the blob (its slot left zero, as mkfs.erofs writes it)
  sb.writeUInt16LE(DEVICE_TABLE_OFFSET / DEVICE_SLOT_BYTES, 0x58);
  sb.writeUInt32LE(crc32c(0xffffffff, sb), 0x04);
  writeSync(fd, sb, 0, sb.length, SUPER_OFFSET);
}

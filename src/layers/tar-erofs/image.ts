import { RollboxError } from '../../api/index.ts';
import { EROFS_MAGIC, FEATURE_COMPAT_SB_CHKSUM, SUPER_OFFSET, crc32c } from '../erofs.ts';
import type { DirNode, LayerNode } from './tree.ts';

/**
 * The EROFS metadata image of a layer tree whose file contents are in a separate data
 * blob (the image's one extra device), laid out as mkfs.erofs 1.5 lays out `--blobdev
 * --chunksize` images (checked against it in test/tar-erofs.test.ts): extended inodes,
 * file contents chunk-indexed into the blob, directories and symlink targets inline after
 * their inode where they fit, xattrs inline. Format: the kernel's fs/erofs/erofs_fs.h.
 */

export const BLOCK_BYTES = 4096;
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
const XATTR_HEADER_BYTES = 12;
const FILE_TYPE = { file: 1, dir: 2, chr: 3, fifo: 5, symlink: 7 };
const S_IF = { file: 0o100000, dir: 0o040000, chr: 0o020000, fifo: 0o010000, symlink: 0o120000 };
/** Longest prefix first: the index EROFS stores for a name, and the rest of the name. */
const XATTR_PREFIXES: [string, number][] = [
  ['system.posix_acl_access', 2],
  ['system.posix_acl_default', 3],
  ['user.', 1],
  ['trusted.', 4],
  ['security.', 6],
];

interface Inode {
  node: LayerNode;
  nid: number;
  ino: number;
  nlink: number;
  /** For directories: the parent, for `..`. */
  parent?: Inode;
  xattrArea: Buffer;
  /** Directory blocks or a symlink target. */
  data?: Buffer[];
  /** The last data block goes inline after the inode. */
  inlineTail: boolean;
  rawBlock: number;
  chunks: number;
}

type Dirent = { name: Buffer; inode: Inode };

export interface MetaImageOptions {
  chunkSizeBytes: number;
}

export function erofsMetaImage(root: DirNode, opts: MetaImageOptions): Buffer {
  const chunkBits = Math.log2(opts.chunkSizeBytes) - BLOCK_BITS;
  if (!Number.isInteger(chunkBits) || chunkBits < 0 || chunkBits > 31) throw new RollboxError('internal', `chunk size ${opts.chunkSizeBytes} is not a power of two of at least a block`);

  // Every inode once (hard links share one), parents before children; link counts as a file system keeps them.
  const inodes: Inode[] = [];
  const byNode = new Map<LayerNode, Inode>();
  const entriesOf = new Map<Inode, Dirent[]>();
  const add = (node: LayerNode, parent?: Inode): Inode => {
    const known = byNode.get(node);
    if (known) {
      known.nlink++;
      return known;
    }
    const inode: Inode = { node, nid: 0, ino: inodes.length + 1, nlink: node.kind === 'dir' ? 2 : 1, ...(parent ? { parent } : {}), xattrArea: xattrArea(node), inlineTail: false, rawBlock: NULL_ADDR, chunks: 0 };
    byNode.set(node, inode);
    inodes.push(inode);
    return inode;
  };
  const rootInode = add(root);
  rootInode.parent = rootInode;
  for (let i = 0; i < inodes.length; i++) {
    const dir = inodes[i]!;
    if (dir.node.kind !== 'dir') continue;
    const entries: Dirent[] = [];
    for (const [name, child] of dir.node.children) {
      const inode = add(child, dir);
      if (child.kind === 'dir') dir.nlink++;
      entries.push({ name: Buffer.from(name, 'utf8'), inode });
    }
    entries.push({ name: Buffer.from('.'), inode: dir }, { name: Buffer.from('..'), inode: dir.parent! });
    entries.sort((a, b) => Buffer.compare(a.name, b.name));
    entriesOf.set(dir, entries);
  }

  // Sizes first (a directory's size depends on its names only), then places, then bytes.
  for (const inode of inodes) {
    const n = inode.node;
    if (n.kind === 'dir') inode.data = direntBlockSizes(entriesOf.get(inode)!).map((size) => Buffer.alloc(size));
    else if (n.kind === 'symlink') inode.data = splitBlocks(n.target);
    else if (n.kind === 'file') inode.chunks = Math.ceil(n.sizeBytes / opts.chunkSizeBytes);
  }
  let cursor = FIRST_INODE_OFFSET;
  for (const inode of inodes) {
    const head = INODE_BYTES + inode.xattrArea.length;
    if (head > BLOCK_BYTES) throw new RollboxError('invalid_layer', `extended attributes of one file take ${inode.xattrArea.length} bytes; a layer allows at most ${BLOCK_BYTES - INODE_BYTES}`);
    const tail = inode.data?.[inode.data.length - 1];
    // Inline only a partial last block, and only where it fits beside its inode.
    inode.inlineTail = tail !== undefined && tail.length < BLOCK_BYTES && head + tail.length <= BLOCK_BYTES;
    const inBlock = head + (inode.inlineTail ? tail!.length : 0);
    cursor = alignUp(cursor, NID_BYTES);
    if ((cursor % BLOCK_BYTES) + inBlock > BLOCK_BYTES) cursor = alignUp(cursor, BLOCK_BYTES);
    inode.nid = cursor / NID_BYTES;
    cursor += inBlock;
    if (inode.chunks > 0) cursor = alignUp(cursor, CHUNK_INDEX_BYTES) + inode.chunks * CHUNK_INDEX_BYTES;
  }
  if (rootInode.nid > 0xffff) throw new RollboxError('internal', 'root inode out of the superblock field range');
  let nextBlock = Math.ceil(cursor / BLOCK_BYTES);
  for (const inode of inodes) {
    const whole = (inode.data?.length ?? 0) - (inode.inlineTail ? 1 : 0);
    if (whole > 0) {
      inode.rawBlock = nextBlock;
      nextBlock += whole;
    }
  }

  const image = Buffer.alloc(nextBlock * BLOCK_BYTES);
  for (const inode of inodes) {
    if (inode.node.kind === 'dir') fillDirentBlocks(inode.data!, entriesOf.get(inode)!);
    writeInode(image, inode, chunkBits);
  }
  writeSuperblock(image, { rootNid: rootInode.nid, inodes: inodes.length, blocks: nextBlock });
  return image;
}

function writeInode(image: Buffer, inode: Inode, chunkBits: number): void {
  const n = inode.node;
  const at = inode.nid * NID_BYTES;
  const size = n.kind === 'file' ? n.sizeBytes : (inode.data ?? []).reduce((s, b) => s + b.length, 0);
  const layout = n.kind === 'file' ? (inode.chunks > 0 ? LAYOUT.chunkBased : LAYOUT.flatPlain) : inode.inlineTail ? LAYOUT.flatInline : LAYOUT.flatPlain;
  const type = n.kind === 'whiteout' ? S_IF.chr : S_IF[n.kind];
  image.writeUInt16LE(1 | (layout << 1), at); // i_format: extended inode
  image.writeUInt16LE(inode.xattrArea.length === 0 ? 0 : (inode.xattrArea.length - XATTR_HEADER_BYTES) / 4 + 1, at + 2);
  image.writeUInt16LE(type | (n.kind === 'whiteout' ? 0 : n.mode & 0o7777), at + 4);
  image.writeBigUInt64LE(BigInt(size), at + 8);
  // i_u: the chunk format, a device number (0: whiteouts and FIFOs) or the first data block.
  const u = n.kind === 'file' ? (inode.chunks > 0 ? CHUNK_FORMAT_INDEXES | chunkBits : 0) : n.kind === 'dir' || n.kind === 'symlink' ? inode.rawBlock : 0;
  image.writeUInt32LE(u, at + 16);
  image.writeUInt32LE(inode.ino, at + 20);
  image.writeUInt32LE(n.uid, at + 24);
  image.writeUInt32LE(n.gid, at + 28);
  const sec = Math.floor(n.mtimeMs / 1000);
  image.writeBigInt64LE(BigInt(sec), at + 32);
  image.writeUInt32LE(Math.round((n.mtimeMs - sec * 1000) * 1e6), at + 40);
  image.writeUInt32LE(inode.nlink, at + 44);
  let pos = at + INODE_BYTES;
  inode.xattrArea.copy(image, pos);
  pos += inode.xattrArea.length;
  const data = inode.data ?? [];
  data.forEach((block, i) => {
    const inline = inode.inlineTail && i === data.length - 1;
    block.copy(image, inline ? pos : (inode.rawBlock + i) * BLOCK_BYTES);
  });
  if (n.kind === 'file' && inode.chunks > 0) {
    pos = alignUp(pos, CHUNK_INDEX_BYTES);
    const firstBlock = n.blobOffset / BLOCK_BYTES;
    for (let c = 0; c < inode.chunks; c++) {
      image.writeUInt16LE(0, pos); // advise
      image.writeUInt16LE(1, pos + 2); // device 1: the data blob
      image.writeUInt32LE(firstBlock + c * (1 << chunkBits), pos + 4);
      pos += CHUNK_INDEX_BYTES;
    }
  }
}

function writeSuperblock(image: Buffer, s: { rootNid: number; inodes: number; blocks: number }): void {
  const sb = image.subarray(SUPER_OFFSET, BLOCK_BYTES);
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
}

/** How many bytes each directory block holds: entries in name order, packed greedily. */
function direntBlockSizes(entries: readonly Dirent[]): number[] {
  const sizes: number[] = [];
  let used = 0;
  for (const e of entries) {
    const need = DIRENT_BYTES + e.name.length;
    if (used + need > BLOCK_BYTES) {
      sizes.push(BLOCK_BYTES);
      used = 0;
    }
    used += need;
  }
  sizes.push(used);
  // Every block but the last is a full block on disk (its slack zeroed).
  return sizes;
}

function fillDirentBlocks(blocks: Buffer[], entries: readonly Dirent[]): void {
  let e = 0;
  for (const block of blocks) {
    // The same greedy split as direntBlockSizes.
    const start = e;
    let used = 0;
    while (e < entries.length && used + DIRENT_BYTES + entries[e]!.name.length <= BLOCK_BYTES) used += DIRENT_BYTES + entries[e++]!.name.length;
    let nameOff = (e - start) * DIRENT_BYTES;
    for (let i = start; i < e; i++) {
      const { name, inode } = entries[i]!;
      const at = (i - start) * DIRENT_BYTES;
      block.writeBigUInt64LE(BigInt(inode.nid), at);
      block.writeUInt16LE(nameOff, at + 8);
      block.writeUInt8(fileTypeOf(inode.node), at + 10);
      name.copy(block, nameOff);
      nameOff += name.length;
    }
  }
}

function fileTypeOf(node: LayerNode): number {
  return node.kind === 'whiteout' ? FILE_TYPE.chr : FILE_TYPE[node.kind];
}

function splitBlocks(bytes: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0; at < bytes.length; at += BLOCK_BYTES) out.push(bytes.subarray(at, at + BLOCK_BYTES));
  return out;
}

/** The inline xattr area: a header, then each entry (name index, the rest of the name, the value) padded to 4 bytes. */
function xattrArea(node: LayerNode): Buffer {
  if (node.xattrs.size === 0) return Buffer.alloc(0);
  const parts: Buffer[] = [Buffer.alloc(XATTR_HEADER_BYTES)];
  for (const [name, value] of node.xattrs) {
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

function alignUp(n: number, to: number): number {
  return Math.ceil(n / to) * to;
}

import { closeSync, openSync, readSync, rmSync, writeSync } from 'node:fs';
import { RollboxError } from '../../api/index.ts';

export type NodeKind = 'dir' | 'file' | 'symlink' | 'fifo' | 'whiteout';
/** A FIFO, or an overlayfs whiteout (a 0:0 character device), has no contents. */
export const KIND = { dir: 1, file: 2, symlink: 3, fifo: 4, whiteout: 5 } as const;
const KIND_NAMES: NodeKind[] = ['dir', 'dir', 'file', 'symlink', 'fifo', 'whiteout'];

export interface NodeMetaInit {
  /** Permission bits with set-id and sticky (07777); the file type is the node's kind. */
  mode: number;
  uid: number;
  gid: number;
  mtimeMs: number;
}

/** No node, no entry (entry ids start at 1; node 0 is the root). */
export const NONE = -1;
const NO_ENTRY = 0;
/** Entry ids 1 and 2 name `.` and `..` (for the image writer's dirent sort). */
export const DOT_ENTRY = 1;
export const DOTDOT_ENTRY = 2;

const POSIX_ACL_ACCESS = 'system.posix_acl_access';
const ACL_XATTR_VERSION = 2;
const ACL_TAG = { userObj: 0x01, user: 0x02, groupObj: 0x04, group: 0x08, mask: 0x10, other: 0x20 };
const MAX_NAME_BYTES = 255;

function refuse(message: string): never {
  throw new RollboxError('invalid_layer', message);
}

type Column = Uint8Array | Uint16Array | Uint32Array | Float64Array;
function grown<T extends Column>(column: T, length: number): T {
  const next = new (column.constructor as new (n: number) => T)(length);
  next.set(column);
  return next;
}

/**
 * A layer's file tree in memory, changed entry by entry with the semantics the safe
 * extractor (extract.ts) gives a tar on disk, so both ways of building a layer show the
 * same files: a later entry replaces an earlier one (a directory over a directory keeps
 * its children), parents a tar leaves implicit are directories 0755 root:root at time 0,
 * and no path may pass through anything but a directory.
 *
 * Kept in columns (typed arrays) and one byte arena for names, not an
 * object per file: about 70 bytes a node plus its name (docs/operations.md), where objects
 * and Maps cost over a kilobyte (1,000,000 entries took a gateway to 1.6 GiB). Nodes are
 * the files (a hard link is a second entry of one node); entries are the names, each in
 * its directory's list in the order first placed there, and in a hash table by
 * (directory, name). Symlink targets wait in a file.
 */
export class LayerTree {
  nodeCount = 1;
  kind = new Uint8Array(1024);
  mode = new Uint16Array(1024);
  uid = new Uint32Array(1024);
  gid = new Uint32Array(1024);
  mtimeMs = new Float64Array(1024);
  /** A file's size; a symlink target's offset in the targets file. */
  a = new Float64Array(1024);
  /** A file's offset in the data blob; a symlink target's length. */
  b = new Float64Array(1024);
  /** A directory's first and last entry (in the order placed). */
  firstEntry = new Uint32Array(1024);
  lastEntry = new Uint32Array(1024);
  /** Extended attributes of the few nodes that have any. */
  readonly xattrs = new Map<number, Map<string, Buffer>>();

  entryCount = 3;
  entryNode = new Uint32Array(1024);
  entryParent = new Uint32Array(1024);
  nextEntry = new Uint32Array(1024);
  nameOffset = new Uint32Array(1024);
  nameBytes = new Uint8Array(1024);
  private chain = new Uint32Array(1024);
  private buckets = new Uint32Array(1024);

  /** Names, one after another (`..` first: the names of entries 1 and 2). */
  arena = Buffer.alloc(64 * 1024);
  private arenaUsed = 2;
  private readonly scratch = Buffer.alloc(4 * MAX_NAME_BYTES);
  /** The directories of the last path resolved (components, node ids): tars list a directory's files together. */
  private cachedComps: string[] = [];
  private cachedDirs: number[] = [];

  private targetsFd: number | undefined;
  private targetsBytes = 0;

  /** `targetsPath`: where symlink targets are kept while the tree lives (see dispose). */
  constructor(private readonly targetsPath: string) {
    this.arena.write('..');
    this.nameBytes[DOT_ENTRY] = 1;
    this.nameBytes[DOTDOT_ENTRY] = 2;
    this.kind[0] = KIND.dir;
    this.mode[0] = 0o755;
  }

  kindOf(node: number): NodeKind {
    return KIND_NAMES[this.kind[node]!]!;
  }

  /** A new node, in no directory yet. */
  addNode(kind: NodeKind, meta: NodeMetaInit, a = 0, b = 0): number {
    if (this.nodeCount === this.kind.length) this.growNodes();
    const n = this.nodeCount++;
    this.kind[n] = KIND[kind];
    this.setMeta(n, meta);
    this.a[n] = a;
    this.b[n] = b;
    return n;
  }

  /** A symlink's target, kept in the targets file (up to 4 KiB each: not in memory). */
  addTarget(target: string): { offset: number; length: number } {
    const bytes = Buffer.from(target, 'utf8');
    this.targetsFd ??= openSync(this.targetsPath, 'wx+', 0o600);
    const offset = this.targetsBytes;
    for (let done = 0; done < bytes.length; ) done += writeSync(this.targetsFd, bytes, done, bytes.length - done, offset + done);
    this.targetsBytes += bytes.length;
    return { offset, length: bytes.length };
  }

  /** A symlink node's target. */
  targetOf(node: number): Buffer {
    const bytes = Buffer.alloc(this.b[node]!);
    for (let got = 0; got < bytes.length; ) got += readSync(this.targetsFd!, bytes, got, bytes.length - got, this.a[node]! + got);
    return bytes;
  }

  /** Removes the targets file. */
  dispose(): void {
    if (this.targetsFd === undefined) return;
    closeSync(this.targetsFd);
    this.targetsFd = undefined;
    rmSync(this.targetsPath, { force: true });
  }

  /** The node at `comps`, or NONE. */
  lookup(comps: readonly string[]): number {
    let node = 0;
    for (const c of comps) {
      if (this.kind[node] !== KIND.dir) return NONE;
      const e = this.find(node, c);
      if (e === NO_ENTRY) return NONE;
      node = this.entryNode[e]!;
    }
    return node;
  }

  /** The directory `comps` names, made (with its parents) where missing. */
  ensureDir(comps: readonly string[]): number {
    let have = 0;
    while (have < comps.length && have < this.cachedComps.length && comps[have] === this.cachedComps[have]) have++;
    let dir = have === 0 ? 0 : this.cachedDirs[have - 1]!;
    this.cachedComps.length = have;
    this.cachedDirs.length = have;
    for (let i = have; i < comps.length; i++) {
      const e = this.find(dir, comps[i]!);
      if (e === NO_ENTRY) {
        const made = this.addNode('dir', { mode: 0o755, uid: 0, gid: 0, mtimeMs: 0 });
        this.link(dir, comps[i]!, made);
        dir = made;
      } else if (this.kind[this.entryNode[e]!] === KIND.dir) {
        dir = this.entryNode[e]!;
      } else {
        refuse(`entry path ${JSON.stringify(comps.slice(0, i + 1).join('/'))} passes through a ${this.kind[this.entryNode[e]!] === KIND.symlink ? 'symlink' : 'non-directory'}`);
      }
      this.cachedComps.push(comps[i]!);
      this.cachedDirs.push(dir);
    }
    return dir;
  }

  /** Puts `node` at `comps` (not the root), replacing whatever was there with everything under it. */
  place(comps: readonly string[], node: number): void {
    const dir = this.ensureDir(comps.slice(0, -1));
    const name = comps[comps.length - 1]!;
    const e = this.find(dir, name);
    if (e === NO_ENTRY) {
      this.link(dir, name, node);
      return;
    }
    // A directory replaced: the resolved paths through it are no more.
    if (this.kind[this.entryNode[e]!] === KIND.dir) this.cachedComps.length = this.cachedDirs.length = 0;
    this.entryNode[e] = node;
  }

  /** A directory entry: an existing directory keeps its children and takes the new metadata. */
  putDir(comps: readonly string[], meta: NodeMetaInit): void {
    const existing = this.lookupIn(comps);
    if (existing !== NONE && this.kind[existing] === KIND.dir) this.setMeta(existing, meta);
    else this.place(comps, this.addNode('dir', meta));
  }

  /**
   * An extended attribute, set after every entry (as the extractor does): on whatever is
   * at `comps` then. An access ACL behaves as setxattr makes it on a file system: it sets
   * the mode's permission bits, and one the mode says fully is not kept.
   */
  setXattr(comps: readonly string[], name: string, value: Buffer): void {
    const node = this.lookup(comps);
    if (node === NONE) return;
    let xattrs = this.xattrs.get(node);
    if (name === POSIX_ACL_ACCESS) {
      const acl = aclMode(value, comps.join('/'));
      this.mode[node] = (this.mode[node]! & ~0o777) | acl.mode;
      if (acl.equivalent) {
        xattrs?.delete(name);
        return;
      }
    }
    if (!xattrs) this.xattrs.set(node, (xattrs = new Map()));
    xattrs.set(name, value);
  }

  /** The node at `comps` once its parents are made (the root for []). */
  private lookupIn(comps: readonly string[]): number {
    if (comps.length === 0) return 0;
    const e = this.find(this.ensureDir(comps.slice(0, -1)), comps[comps.length - 1]!);
    return e === NO_ENTRY ? NONE : this.entryNode[e]!;
  }

  private setMeta(n: number, meta: NodeMetaInit): void {
    this.mode[n] = meta.mode;
    this.uid[n] = meta.uid;
    this.gid[n] = meta.gid;
    this.mtimeMs[n] = meta.mtimeMs;
  }

  /** The entry named `name` in directory `dir`, or NO_ENTRY. */
  private find(dir: number, name: string): number {
    const length = this.scratch.write(name);
    const key = this.scratch.subarray(0, length);
    for (let e = this.buckets[hashOf(dir, key) & (this.buckets.length - 1)]!; e !== NO_ENTRY; e = this.chain[e]!) {
      if (this.entryParent[e] === dir && this.nameBytes[e] === length && this.arena.compare(key, 0, length, this.nameOffset[e]!, this.nameOffset[e]! + length) === 0) return e;
    }
    return NO_ENTRY;
  }

  /** A new entry `name` -> `node`, last in `dir`'s list. */
  private link(dir: number, name: string, node: number): void {
    if (this.entryCount === this.entryNode.length) this.growEntries();
    const e = this.entryCount++;
    const length = this.scratch.write(name);
    const offset = this.reserve(length);
    this.scratch.copy(this.arena, offset, 0, length);
    this.entryNode[e] = node;
    this.entryParent[e] = dir;
    this.nameOffset[e] = offset;
    this.nameBytes[e] = length;
    if (this.firstEntry[dir] === NO_ENTRY) this.firstEntry[dir] = e;
    else this.nextEntry[this.lastEntry[dir]!] = e;
    this.lastEntry[dir] = e;
    if (this.entryCount > this.buckets.length) this.rehash(this.buckets.length * 2);
    else this.hashIn(e);
  }

  private hashIn(e: number): void {
    const at = hashOf(this.entryParent[e]!, this.arena.subarray(this.nameOffset[e]!, this.nameOffset[e]! + this.nameBytes[e]!)) & (this.buckets.length - 1);
    this.chain[e] = this.buckets[at]!;
    this.buckets[at] = e;
  }

  private rehash(size: number): void {
    this.buckets = new Uint32Array(size);
    for (let e = DOTDOT_ENTRY + 1; e < this.entryCount; e++) this.hashIn(e);
  }

  /** `length` bytes at the end of the arena, grown as needed. */
  private reserve(length: number): number {
    if (this.arenaUsed + length > this.arena.length) {
      const next = Buffer.alloc(Math.max(this.arena.length * 2, this.arenaUsed + length));
      this.arena.copy(next, 0, 0, this.arenaUsed);
      this.arena = next;
    }
    const offset = this.arenaUsed;
    this.arenaUsed += length;
    return offset;
  }

  private growNodes(): void {
    const n = this.kind.length * 2;
    this.kind = grown(this.kind, n);
    this.mode = grown(this.mode, n);
    this.uid = grown(this.uid, n);
    this.gid = grown(this.gid, n);
    this.mtimeMs = grown(this.mtimeMs, n);
    this.a = grown(this.a, n);
    this.b = grown(this.b, n);
    this.firstEntry = grown(this.firstEntry, n);
    this.lastEntry = grown(this.lastEntry, n);
  }

  private growEntries(): void {
    const n = this.entryNode.length * 2;
    this.entryNode = grown(this.entryNode, n);
    this.entryParent = grown(this.entryParent, n);
    this.nextEntry = grown(this.nextEntry, n);
    this.nameOffset = grown(this.nameOffset, n);
    this.nameBytes = grown(this.nameBytes, n);
    this.chain = grown(this.chain, n);
  }
}

/** FNV-1a over the directory and the name's bytes. */
function hashOf(dir: number, name: Uint8Array): number {
  let h = (0x811c9dc5 ^ dir) >>> 0;
  h = Math.imul(h, 0x01000193);
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name[i]!, 0x01000193);
  return h >>> 0;
}

/** The permission bits an access ACL gives, and whether the mode alone says it all (the kernel's posix_acl_equiv_mode). */
function aclMode(value: Buffer, where: string): { mode: number; equivalent: boolean } {
  if (value.length < 4 || (value.length - 4) % 8 !== 0 || value.readUInt32LE(0) !== ACL_XATTR_VERSION) refuse(`entry ${JSON.stringify(where)}: malformed POSIX ACL`);
  let mode = 0;
  let equivalent = true;
  for (let at = 4; at < value.length; at += 8) {
    const tag = value.readUInt16LE(at);
    const perm = value.readUInt16LE(at + 2) & 0o7;
    if (tag === ACL_TAG.userObj) mode |= perm << 6;
    else if (tag === ACL_TAG.groupObj) mode |= perm << 3;
    else if (tag === ACL_TAG.other) mode |= perm;
    else if (tag === ACL_TAG.mask) {
      mode = (mode & ~0o70) | (perm << 3);
      equivalent = false;
    } else if (tag === ACL_TAG.user || tag === ACL_TAG.group) equivalent = false;
    else refuse(`entry ${JSON.stringify(where)}: POSIX ACL entry with unknown tag ${tag}`);
  }
  return { mode, equivalent };
}

import { RollboxError } from '../../api/index.ts';

interface NodeMeta {
  /** Permission bits with set-id and sticky (07777); the file type is `kind`. */
  mode: number;
  uid: number;
  gid: number;
  mtimeMs: number;
  xattrs: Map<string, Buffer>;
}

export interface DirNode extends NodeMeta {
  kind: 'dir';
  children: Map<string, LayerNode>;
}
export interface FileNode extends NodeMeta {
  kind: 'file';
  sizeBytes: number;
  /** Where its contents start in the data blob (block aligned). */
  blobOffset: number;
}
export interface SymlinkNode extends NodeMeta {
  kind: 'symlink';
  target: Buffer;
}
/** A FIFO, or an overlayfs whiteout (a 0:0 character device). */
export interface SpecialNode extends NodeMeta {
  kind: 'fifo' | 'whiteout';
}
export type LayerNode = DirNode | FileNode | SymlinkNode | SpecialNode;

export type NodeMetaInit = Omit<NodeMeta, 'xattrs'>;

const POSIX_ACL_ACCESS = 'system.posix_acl_access';
const ACL_XATTR_VERSION = 2;
const ACL_TAG = { userObj: 0x01, user: 0x02, groupObj: 0x04, group: 0x08, mask: 0x10, other: 0x20 };

function refuse(message: string): never {
  throw new RollboxError('invalid_layer', message);
}

/**
 * A layer's file tree in memory, changed entry by entry with the semantics the safe
 * extractor (extract.ts) gives a tar on disk, so both ways of building a layer show the
 * same files: a later entry replaces an earlier one (a directory over a directory keeps
 * its children), parents a tar leaves implicit are directories 0755 root:root at time 0,
 * and no path may pass through anything but a directory.
 */
export class LayerTree {
  readonly root: DirNode = dirNode({ mode: 0o755, uid: 0, gid: 0, mtimeMs: 0 });

  /** The node at `comps`, if any. */
  lookup(comps: readonly string[]): LayerNode | undefined {
    let node: LayerNode = this.root;
    for (const c of comps) {
      if (node.kind !== 'dir') return undefined;
      const next = node.children.get(c);
      if (!next) return undefined;
      node = next;
    }
    return node;
  }

  /** The directory `comps` names, made (with its parents) where missing. */
  ensureDir(comps: readonly string[]): DirNode {
    let dir = this.root;
    for (let i = 0; i < comps.length; i++) {
      const c = comps[i]!;
      const next = dir.children.get(c);
      if (!next) {
        const made = dirNode({ mode: 0o755, uid: 0, gid: 0, mtimeMs: 0 });
        dir.children.set(c, made);
        dir = made;
      } else if (next.kind === 'dir') {
        dir = next;
      } else {
        refuse(`entry path ${JSON.stringify(comps.slice(0, i + 1).join('/'))} passes through a ${next.kind === 'symlink' ? 'symlink' : 'non-directory'}`);
      }
    }
    return dir;
  }

  /** Puts `node` at `comps` (not the root), replacing whatever was there with everything under it. */
  place(comps: readonly string[], node: LayerNode): void {
    this.ensureDir(comps.slice(0, -1)).children.set(comps[comps.length - 1]!, node);
  }

  /** A directory entry: an existing directory keeps its children and takes the new metadata. */
  putDir(comps: readonly string[], meta: NodeMetaInit): void {
    const existing = comps.length === 0 ? this.root : this.ensureDir(comps.slice(0, -1)).children.get(comps[comps.length - 1]!);
    if (existing?.kind === 'dir') Object.assign(existing, meta);
    else this.place(comps, dirNode(meta));
  }

  /**
   * An extended attribute, set after every entry (as the extractor does): on whatever is
   * at `comps` then. An access ACL behaves as setxattr makes it on a file system: it sets
   * the mode's permission bits, and one the mode says fully is not kept.
   */
  setXattr(comps: readonly string[], name: string, value: Buffer): void {
    const node = this.lookup(comps);
    if (!node) return;
    if (name === POSIX_ACL_ACCESS) {
      const acl = aclMode(value, comps.join('/'));
      node.mode = (node.mode & ~0o777) | acl.mode;
      if (acl.equivalent) {
        node.xattrs.delete(name);
        return;
      }
    }
    node.xattrs.set(name, value);
  }
}

export function dirNode(meta: NodeMetaInit): DirNode {
  return { kind: 'dir', ...meta, xattrs: new Map(), children: new Map() };
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

import { lstat, utimes } from 'node:fs/promises';
import { RollboxError } from '../api/index.ts';
import { runToolOk } from '../proc/index.ts';

/** The overlay mark of a directory whose lower layers' contents are hidden. */
export const OPAQUE_XATTR = 'trusted.overlay.opaque';
const OPAQUE_MARKER = '.wh..wh..opq';
const WHITEOUT_PREFIX = '.wh.';
/** xattr namespaces an image layer may carry; `trusted.*` would let a tar forge overlay metadata. */
const KEPT_XATTR = /^(user\.|security\.capability$|system\.posix_acl_(access|default)$)/;
const MAX_XATTR_VALUE_BYTES = 64 * 1024;

function refuse(message: string): never {
  throw new RollboxError('invalid_layer', message);
}

type EntryHeader = { name: string; type?: string | null; devmajor?: number; devminor?: number };

/** What an image-layer tar entry means beyond plain files: a whiteout, an opaque marker, or nothing special. */
export type ImageEntryKind = { kind: 'whiteout'; comps: string[] } | { kind: 'opaque'; dirComps: string[] } | { kind: 'plain' };

/**
 * What an image-layer tar entry means: `.wh.NAME` deletes NAME of the layers below,
 * `.wh..wh..opq` hides everything below of its directory, and a 0:0 character device is a
 * whiteout already in overlayfs' own form.
 */
export function classifyImageEntry(comps: readonly string[], header: EntryHeader): ImageEntryKind {
  const leaf = comps[comps.length - 1] ?? '';
  if (leaf === OPAQUE_MARKER) return { kind: 'opaque', dirComps: comps.slice(0, -1) };
  if (leaf.startsWith(WHITEOUT_PREFIX)) {
    const hidden = leaf.slice(WHITEOUT_PREFIX.length);
    if (hidden === '' || hidden === '.' || hidden === '..' || hidden.startsWith(WHITEOUT_PREFIX)) refuse(`whiteout ${JSON.stringify(header.name)} names nothing`);
    return { kind: 'whiteout', comps: [...comps.slice(0, -1), hidden] };
  }
  if (header.type === 'character-device' && !header.devmajor && !header.devminor) return { kind: 'whiteout', comps: [...comps] };
  return { kind: 'plain' };
}

/**
 * What an overlay upper dir's entry means as it is on disk (a microVM's snapshot stream):
 * only a 0:0 character device is special, a whiteout; `.wh.` names are plain names there.
 */
export function classifyUpperEntry(comps: readonly string[], header: EntryHeader): ImageEntryKind {
  if (header.type === 'character-device' && !header.devmajor && !header.devminor) return { kind: 'whiteout', comps: [...comps] };
  return { kind: 'plain' };
}

/**
 * The extended attributes an image layer entry keeps, from its PAX records
 * (`LIBARCHIVE.xattr.*` base64, or `SCHILY.xattr.*`), in their order: user.*, file
 * capabilities and POSIX ACLs. `trusted.*` is refused (it would forge overlay metadata),
 * but for a directory's opaque mark where `opaqueMark` allows it (an upper dir's entry:
 * `trusted.overlay.opaque` "y", nothing else); names meaning nothing here
 * (security.selinux and the like) are dropped.
 */
export function imageXattrsOf(entryName: string, pax: Record<string, string> | null | undefined, opaqueMark = false): [string, Buffer][] {
  if (!pax) return [];
  const values = new Map<string, Buffer>();
  for (const [key, raw] of Object.entries(pax)) {
    if (key.startsWith('SCHILY.xattr.')) {
      const name = key.slice('SCHILY.xattr.'.length);
      // The tar reader decodes PAX values as UTF-8: a binary value arrives with U+FFFD in it and cannot be restored.
      if (raw.includes('\uFFFD') && !values.has(name)) refuse(`entry ${JSON.stringify(entryName)}: xattr ${name} holds bytes that are not UTF-8; write it as LIBARCHIVE.xattr (base64)`);
      if (!values.has(name)) values.set(name, Buffer.from(raw, 'utf8'));
    } else if (key.startsWith('LIBARCHIVE.xattr.')) {
      values.set(decodeURIComponent(key.slice('LIBARCHIVE.xattr.'.length)), Buffer.from(raw, 'base64'));
    }
  }
  const kept: [string, Buffer][] = [];
  for (const [name, value] of values) {
    if (opaqueMark && name === OPAQUE_XATTR) {
      if (!value.equals(Buffer.from('y'))) refuse(`entry ${JSON.stringify(entryName)}: ${OPAQUE_XATTR} is not "y"`);
      kept.push([name, value]);
      continue;
    }
    if (name.startsWith('trusted.')) refuse(`entry ${JSON.stringify(entryName)} carries a trusted.* xattr (${name}), which a layer may not set`);
    if (!KEPT_XATTR.test(name)) continue; // security.selinux and the like mean nothing here
    if (value.length > MAX_XATTR_VALUE_BYTES) refuse(`entry ${JSON.stringify(entryName)}: xattr ${name} is larger than ${MAX_XATTR_VALUE_BYTES} bytes`);
    kept.push([name, value]);
  }
  return kept;
}

/**
 * Extracts an image layer's special entries (classifyImageEntry) into a tree as overlayfs'
 * own marks (0:0 character devices, the `trusted.overlay.opaque` xattr), so an image layer
 * works as one lower layer of the sandbox's overlay, like a snapshot's.
 */
export class ImageLayerEntries {
  private readonly opaqueDirs: string[] = [];
  private readonly xattrs: { path: string; name: string; value: Buffer }[] = [];

  constructor(private readonly abs: (comps: readonly string[]) => string) {}

  /**
   * A whiteout hides only what lies below this layer: an entry of the same name earlier in
   * this layer stays (OCI image spec), and one later in it replaces the whiteout.
   */
  async whiteout(comps: readonly string[]): Promise<void> {
    const p = this.abs(comps);
    if (await lstat(p).then(() => true, () => false)) return;
    await runToolOk('mknod', ['-m', '0000', '--', p, 'c', '0', '0']);
    // Time 0, not the extraction's: the same tar must give the same EROFS image.
    await utimes(p, 0, 0);
  }

  opaque(dirComps: readonly string[]): void {
    this.opaqueDirs.push(this.abs(dirComps));
  }

  /** A FIFO (no device behind it): made as the entry comes, so a later entry of the same name replaces it. */
  async fifo(comps: readonly string[]): Promise<void> {
    await runToolOk('mkfifo', ['-m', '0600', '--', this.abs(comps)]);
  }

  /** An entry's extended attributes (see imageXattrsOf), set at finish. */
  noteXattrs(comps: readonly string[], xattrs: readonly [string, Buffer][]): void {
    for (const [name, value] of xattrs) this.xattrs.push({ path: this.abs(comps), name, value });
  }

  /** After every entry and directory mode is in place: xattrs and opaque marks (on what still exists). */
  async finish(): Promise<void> {
    for (const x of this.xattrs) {
      if (!(await lstat(x.path).then(() => true, () => false))) continue; // replaced by a later entry's removal
      await runToolOk('setfattr', ['-h', '-n', x.name, '-v', `0s${x.value.toString('base64')}`, '--', x.path]);
    }
    for (const dir of this.opaqueDirs) {
      if (!(await lstat(dir).then((s) => s.isDirectory(), () => false))) continue;
      await runToolOk('setfattr', ['-h', '-n', OPAQUE_XATTR, '-v', 'y', '--', dir]);
    }
  }
}

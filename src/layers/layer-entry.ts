import path from 'node:path';
import type tar from 'tar-stream';
import { RollboxError } from '../api/index.ts';
import { classifyImageEntry, classifyUpperEntry, imageXattrsOf } from './image-entries.ts';

const MAX_PATH_CHARS = 4096;
const MAX_NAME_BYTES = 255;

function refuse(message: string): never {
  throw new RollboxError('invalid_layer', message);
}

/**
 * Split a tar member name into safe components relative to the layer root. Absolute names
 * and `..` anywhere are refused outright rather than "cleaned": a tar that tries either is
 * not one we want to interpret.
 */
export function entryComponents(name: string, what = 'entry'): string[] {
  if (name.includes('\0')) refuse(`${what} name contains NUL`);
  if (name.length > MAX_PATH_CHARS) refuse(`${what} name longer than ${MAX_PATH_CHARS} characters`);
  if (name.startsWith('/')) refuse(`${what} ${JSON.stringify(name)} is an absolute path`);
  const parts = name.split('/').filter((p) => p !== '' && p !== '.');
  for (const p of parts) {
    if (p === '..') refuse(`${what} ${JSON.stringify(name)} contains a '..' component`);
    if (Buffer.byteLength(p) > MAX_NAME_BYTES) refuse(`${what} ${JSON.stringify(name)} has a component longer than ${MAX_NAME_BYTES} bytes`);
  }
  return parts;
}

/** Whether a symlink stored at `linkComps` with `target` stays inside the layer root when resolved lexically. */
export function symlinkStaysInside(linkComps: readonly string[], target: string): boolean {
  if (target.startsWith('/')) return true; // resolved against the container's root, never the host's
  const resolved = path.posix.normalize(path.posix.join(linkComps.slice(0, -1).join('/') || '.', target));
  return resolved !== '..' && !resolved.startsWith('../');
}

export interface EntryMeta {
  /** Permission bits with set-id and sticky (07777). */
  mode: number;
  uid: number;
  gid: number;
  mtime: Date;
}

/**
 * What one tar entry asks of a layer, checked: the one reading of a layer tar's entries
 * that both builders (the safe extractor and the EROFS writer) apply, each to its own tree.
 * `comps` is the entry's path (a directory's may be [], the layer root); `xattrs` are the
 * image-layer xattrs it carries (see imageXattrsOf).
 */
export type LayerEntry =
  | { kind: 'whiteout'; comps: string[] }
  | { kind: 'opaque'; dirComps: string[] }
  | { kind: 'directory' | 'file' | 'fifo'; comps: string[]; meta: EntryMeta; xattrs: [string, Buffer][] }
  | { kind: 'symlink'; comps: string[]; meta: EntryMeta; xattrs: [string, Buffer][]; target: string }
  | { kind: 'link'; comps: string[]; targetComps: string[]; xattrs: [string, Buffer][] }
  /** A hard link to itself: nothing to make (its xattrs still apply). */
  | { kind: 'none'; comps: string[]; xattrs: [string, Buffer][] };

/**
 * What a layer tar is, which says what its special entries mean:
 *   - `layer`: an uploaded layer; whiteouts, opaque markers, FIFOs and xattrs are refused;
 *   - `image`: an OCI or Docker image layer; `.wh.` names and 0:0 character devices are
 *     whiteouts, `.wh..wh..opq` an opaque marker, FIFOs and the kept xattrs (imageXattrsOf) kept;
 *   - `upper`: an overlay upper dir as it is on disk (a microVM's snapshot stream): 0:0
 *     character devices are whiteouts, a directory's `trusted.overlay.opaque` "y" its
 *     opaque mark, `.wh.` names are names like any other; FIFOs and the kept xattrs kept.
 */
export type LayerTarKind = 'layer' | 'image' | 'upper';

/**
 * Reads a tar entry's header as a layer entry of a tar of `kind`: whiteouts, opaque
 * marks, FIFOs and the kept xattrs mean what overlayfs needs, or are refused (`layer`).
 * Device nodes and other types are always refused.
 */
export function layerEntryOf(h: tar.Header, kind: LayerTarKind): LayerEntry {
  const comps = entryComponents(h.name, 'entry');
  let xattrs: [string, Buffer][] = [];
  if (kind !== 'layer') {
    const special = kind === 'image' ? classifyImageEntry(comps, h) : classifyUpperEntry(comps, h);
    if (special.kind !== 'plain') return special;
    xattrs = imageXattrsOf(h.name, h.pax as Record<string, string> | undefined, kind === 'upper' && h.type === 'directory');
  } else if (comps[comps.length - 1]?.startsWith('.wh.')) {
    refuse(`overlay whiteout ${JSON.stringify(h.name)} belongs in an image (POST /v1/images), not a layer`);
  }
  const meta: EntryMeta = { mode: (h.mode ?? 0o644) & 0o7777, uid: h.uid ?? 0, gid: h.gid ?? 0, mtime: h.mtime ?? new Date(0) };
  const type = h.type ?? 'file';
  if (comps.length === 0 && type !== 'directory') refuse(`entry ${JSON.stringify(h.name)} names the layer root but is not a directory`);
  const rel = comps.join('/');
  switch (type) {
    case 'directory':
      return { kind: 'directory', comps, meta, xattrs };
    case 'file':
    case 'contiguous-file':
      return { kind: 'file', comps, meta, xattrs };
    case 'symlink': {
      const target = h.linkname ?? '';
      if (target === '' || target.includes('\0') || target.length > MAX_PATH_CHARS) refuse(`symlink ${JSON.stringify(rel)} has an invalid target`);
      // An upper dir's symlinks are a sandbox's own (`../../..` climbs to its root and no further) and only
      // ever written into an EROFS image (extractTarSafely refuses `upper` tars): their targets are data here.
      if (kind !== 'upper' && !symlinkStaysInside(comps, target)) refuse(`symlink ${JSON.stringify(rel)} -> ${JSON.stringify(target)} points outside the layer`);
      return { kind: 'symlink', comps, meta, xattrs, target };
    }
    case 'link': {
      const targetComps = entryComponents(h.linkname ?? '', 'hardlink target');
      if (targetComps.length === 0) refuse(`hardlink ${JSON.stringify(rel)} has an empty target`);
      return targetComps.join('/') === rel ? { kind: 'none', comps, xattrs } : { kind: 'link', comps, targetComps, xattrs };
    }
    case 'character-device':
    case 'block-device':
      refuse(`device node ${JSON.stringify(rel)} is not allowed in a layer`);
      break;
    case 'fifo':
      if (kind === 'layer') refuse(`fifo ${JSON.stringify(rel)} is not supported in a layer`);
      return { kind: 'fifo', comps, meta, xattrs };
  }
  refuse(`entry ${JSON.stringify(rel)} has unsupported type ${String(type)}`);
}

/** The message a hard link gets whose target is not an earlier regular file (both builders check it on their own tree). */
export function notAnEarlierFile(entry: { comps: string[]; targetComps: string[] }): never {
  refuse(`hardlink ${JSON.stringify(entry.comps.join('/'))} -> ${JSON.stringify(entry.targetComps.join('/'))} does not name an earlier regular file`);
}

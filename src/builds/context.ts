import { createHash } from 'node:crypto';
import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { RollboxError } from '../api/index.ts';
import { packTar, type TarHeader } from './tar.ts';

/** One entry of a build context, named relative to its root (`dir/file`, no `./`). */
export interface ContextEntry {
  name: string;
  type: 'file' | 'directory' | 'symlink';
  mode: number;
  mtime: Date;
  linkname?: string;
  data?: Buffer;
  /** sha256 of the data (files). */
  sha256?: string;
}

export type BuildContextFiles = Map<string, ContextEntry>;

/** As the kernel's bound on symlinks followed in one lookup. */
const MAX_LINK_HOPS = 40;

const refused = (message: string) => new RollboxError('invalid_archive', `build context: ${message}`);

/**
 * A context tar read whole and checked: only regular files, directories and symlinks; no
 * name that is absolute or climbs out with `..`; no symlink whose target leaves the
 * context. Any of these refuses the whole context (nothing of it is kept).
 */
export async function readContext(archive: Buffer, limits: { maxEntries: number }): Promise<BuildContextFiles> {
  const files: BuildContextFiles = new Map();
  const extract = tar.extract();
  Readable.from([archive]).pipe(extract);
  try {
    for await (const entry of extract) {
      const h = entry.header;
      if (files.size >= limits.maxEntries) throw new RollboxError('payload_too_large', `build context has more than ${limits.maxEntries} entries`);
      const raw = h.name;
      if (raw.startsWith('/') || raw.split('/').includes('..')) throw refused(`entry ${JSON.stringify(raw)} names a path outside the context`);
      const name = path.posix.normalize(raw).replace(/^\.(\/|$)/, '').replace(/\/+$/, '');
      const type = h.type === 'contiguous-file' ? 'file' : h.type ?? 'file';
      if (type !== 'file' && type !== 'directory' && type !== 'symlink') throw refused(`entry ${JSON.stringify(raw)} is a ${type}; a context holds files, directories and symlinks`);
      const chunks: Buffer[] = [];
      for await (const chunk of entry as AsyncIterable<Buffer>) chunks.push(chunk);
      if (name === '' || name === '.') continue;
      const common = { name, type, mode: (h.mode ?? 0o644) & 0o7777, mtime: h.mtime ?? new Date(0) } as const;
      if (type === 'symlink') {
        const target = h.linkname ?? '';
        const resolved = path.posix.normalize(path.posix.join(path.posix.dirname(name), target));
        if (target.startsWith('/') || resolved === '..' || resolved.startsWith('../')) throw refused(`symlink ${JSON.stringify(name)} points out of the context (${JSON.stringify(target)})`);
        files.set(name, { ...common, linkname: target });
      } else if (type === 'file') {
        const data = Buffer.concat(chunks);
        files.set(name, { ...common, data, sha256: createHash('sha256').update(data).digest('hex') });
      } else files.set(name, common);
    }
  } catch (err) {
    if (err instanceof RollboxError) throw err;
    throw refused(`not a readable tar (${err instanceof Error ? err.message : String(err)})`);
  }
  // A name written through one of the context's own symlinks could land anywhere: refused too.
  for (const name of files.keys()) {
    const parts = name.split('/');
    for (let i = 1; i < parts.length; i++) if (files.get(parts.slice(0, i).join('/'))?.type === 'symlink') throw refused(`entry ${JSON.stringify(name)} lies under the symlink ${parts.slice(0, i).join('/')}`);
  }
  return files;
}

/** `.dockerignore` as Docker reads it: one pattern a line, `#` comments, `!` exceptions, the last match deciding. */
export function dockerignore(text: string | undefined): (name: string) => boolean {
  const rules = (text ?? '')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'))
    .map((l) => {
      const negate = l.startsWith('!');
      const pattern = path.posix.normalize((negate ? l.slice(1) : l).trim().replace(/^\/+/, '')).replace(/\/+$/, '');
      return { negate, re: globRegExp(pattern) };
    });
  if (rules.length === 0) return () => false;
  return (name) => {
    let ignored = false;
    // A pattern matching a parent directory covers everything beneath it.
    const prefixes = name.split('/').map((_, i, parts) => parts.slice(0, i + 1).join('/'));
    for (const rule of rules) if (prefixes.some((p) => rule.re.test(p))) ignored = !rule.negate;
    return ignored;
  };
}

/** A Go filepath.Match pattern (with Docker's `**`) as a regular expression over whole names. */
export function globRegExp(pattern: string): RegExp {
  let re = '';
  for (let i = 0; i < pattern.length; i++) {
    const ch = pattern[i]!;
    if (ch === '*' && pattern[i + 1] === '*') {
      re += '.*';
      i++;
      if (pattern[i + 1] === '/') {
        i++;
        re += '(?:/|)';
      }
    } else if (ch === '*') re += '[^/]*';
    else if (ch === '?') re += '[^/]';
    else if (ch === '[') {
      const close = pattern.indexOf(']', i + 1);
      if (close < 0) re += '\\[';
      else {
        re += `[${pattern.slice(i + 1, close).replace(/^!/, '^').replace(/\\/g, '\\\\')}]`;
        i = close;
      }
    } else if (ch === '\\' && i + 1 < pattern.length) re += `\\${pattern[++i]}`;
    else re += ch.replace(/[.+^${}()|\\]/g, '\\$&');
  }
  return new RegExp(`^${re}$`);
}

export const hasGlob = (p: string) => /[*?[]/.test(p);

/**
 * What a COPY source names in the context: the entries it copies and the name each gets
 * under the destination. A directory copies its contents; a file (or symlink) itself;
 * wildcards match names at their level. Ignored entries are not there at all.
 */
export function selectSources(files: BuildContextFiles, sources: readonly string[], ignored: (name: string) => boolean, line: number): { entry: ContextEntry; target: string }[] {
  const out: { entry: ContextEntry; target: string }[] = [];
  for (const source of sources) {
    const clean = path.posix.normalize(source.replace(/^\/+/, '')).replace(/\/+$/, '');
    if (clean === '..' || clean.startsWith('../')) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${line}: COPY source ${JSON.stringify(source)} is outside the context`);
    const roots = clean === '.' ? [''] : hasGlob(clean) ? [...files.keys()].filter((n) => globRegExp(clean).test(n) && !ignored(n)) : files.has(clean) && !ignored(clean) ? [clean] : [];
    if (roots.length === 0) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${line}: COPY source ${JSON.stringify(source)} is not in the context${ignored(clean) ? ' (.dockerignore excludes it)' : ''}`);
    for (const named of roots) {
      // A source that names a symlink copies what it points to, under the link's name (as Docker follows it); links inside a copied directory stay links.
      const root = followLinks(files, named, line);
      const entry = files.get(root);
      if (entry && entry.type !== 'directory') {
        out.push({ entry, target: path.posix.basename(named) });
        continue;
      }
      for (const [name, e] of files) {
        if (root !== '' && !name.startsWith(`${root}/`)) continue;
        if (ignored(name)) continue;
        out.push({ entry: e, target: root === '' ? name : name.slice(root.length + 1) });
      }
    }
  }
  return out;
}

/** Where a context name leads once its symlinks are followed (they cannot leave the context: readContext). */
function followLinks(files: BuildContextFiles, name: string, line: number): string {
  let at = name;
  for (let hops = 0; hops < MAX_LINK_HOPS; hops++) {
    const entry = files.get(at);
    if (entry?.type !== 'symlink') return at;
    at = path.posix.normalize(path.posix.join(path.posix.dirname(at), entry.linkname ?? '')).replace(/^\.(\/|$)/, '');
    if (!files.has(at) && at !== '') throw new RollboxError('invalid_dockerfile', `Dockerfile line ${line}: COPY source ${JSON.stringify(name)} is a symlink to ${JSON.stringify(at)}, which is not in the context`);
  }
  throw new RollboxError('invalid_dockerfile', `Dockerfile line ${line}: COPY source ${JSON.stringify(name)} is a chain of more than ${MAX_LINK_HOPS} symlinks`);
}

/** Several context tars as one, each one's entries under its own prefix (checked as readContext checks them). */
export async function mergeContexts(parts: readonly { prefix: string; tar: Buffer }[], limits: { maxEntries: number }): Promise<Buffer> {
  const entries: { header: TarHeader; data?: Buffer }[] = [];
  for (const { prefix, tar: archive } of parts) {
    entries.push({ header: { name: `${prefix}/`, type: 'directory', mode: 0o755 } });
    for (const e of (await readContext(archive, limits)).values()) {
      entries.push({ header: { name: `${prefix}/${e.name}${e.type === 'directory' ? '/' : ''}`, type: e.type, mode: e.mode, mtime: e.mtime, ...(e.linkname !== undefined ? { linkname: e.linkname } : {}) }, ...(e.data ? { data: e.data } : {}) });
    }
  }
  return packTar(entries);
}

/** A context entry's tar header under a new name: owned by root, as COPY makes it unless --chown says otherwise. */
export function headerOf(entry: ContextEntry, target: string): TarHeader {
  return { name: target, type: entry.type, mode: entry.mode, mtime: entry.mtime, uid: 0, gid: 0, ...(entry.linkname !== undefined ? { linkname: entry.linkname } : {}) };
}

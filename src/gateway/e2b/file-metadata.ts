import type { Redis } from 'ioredis';

/** Kept a little past the sandbox's longest life (its TTL is at most 7 days). */
const METADATA_TTL_SEC = 8 * 24 * 3600;
const HEADER_PREFIX = 'x-metadata-';

const keyOf = (sandboxId: string) => `rb:{sbx:${sandboxId}}:e2b-file-meta`;
const under = (path: string, dir: string) => path === dir || path.startsWith(dir.endsWith('/') ? dir : `${dir}/`);

/** The `X-Metadata-<key>: value` headers of an upload, keys lowercased (envd's reading); none: undefined. */
export function metadataOfHeaders(headers: Record<string, string>): Record<string, string> | undefined {
  const pairs = Object.entries(headers).filter(([k]) => k.toLowerCase().startsWith(HEADER_PREFIX) && k.length > HEADER_PREFIX.length);
  return pairs.length ? Object.fromEntries(pairs.map(([k, v]) => [k.slice(HEADER_PREFIX.length).toLowerCase(), v])) : undefined;
}

/**
 * E2B's file metadata (envd >= 0.6.2: key-value pairs given at upload, read back on every
 * entry). envd keeps them in the file's xattrs; rollbox keeps them beside the sandbox, by
 * path: an upload with metadata sets them, the SDK's rename and remove carry them along,
 * and what commands in the sandbox do to the file is not seen (docs/e2b.md).
 */
export class FileMetadata {
  constructor(private readonly redis: Redis) {}

  async set(sandboxId: string, path: string, metadata: Record<string, string>): Promise<void> {
    await this.redis.multi().hset(keyOf(sandboxId), path, JSON.stringify(metadata)).expire(keyOf(sandboxId), METADATA_TTL_SEC).exec();
  }

  /** The metadata of each path that has some. */
  async of(sandboxId: string, paths: readonly string[]): Promise<Map<string, Record<string, string>>> {
    if (paths.length === 0) return new Map();
    const values = await this.redis.hmget(keyOf(sandboxId), ...paths);
    return new Map(paths.flatMap((p, i) => (values[i] ? [[p, JSON.parse(values[i]) as Record<string, string>] as const] : [])));
  }

  /** A rename of `from` (a file, or a directory with what is under it) to `to`. */
  async move(sandboxId: string, from: string, to: string): Promise<void> {
    const all = await this.redis.hgetall(keyOf(sandboxId));
    const moved = Object.keys(all).filter((p) => under(p, from));
    if (moved.length === 0) return;
    const multi = this.redis.multi().hdel(keyOf(sandboxId), ...moved);
    for (const p of moved) multi.hset(keyOf(sandboxId), to + p.slice(from.length), all[p]!);
    await multi.exec();
  }

  async remove(sandboxId: string, path: string): Promise<void> {
    const gone = (await this.redis.hkeys(keyOf(sandboxId))).filter((p) => under(p, path));
    if (gone.length) await this.redis.hdel(keyOf(sandboxId), ...gone);
  }
}

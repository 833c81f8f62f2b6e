import type { Context } from 'hono';
import { E2bListDirRequest, E2bMoveRequest, E2bPathRequest, type FileEntry } from '../../api/index.ts';
import type { FilesService } from '../files-service.ts';
import { ConnectError, readUnary } from './connect.ts';
import { resolvePath, type EnvdCall } from './envd-common.ts';
import type { FileMetadata } from './file-metadata.ts';

export type E2bFilesApi = Pick<FilesService, 'read' | 'write' | 'stat' | 'list' | 'makeDir' | 'move' | 'remove'>;

const TYPE = { file: 'FILE_TYPE_FILE', directory: 'FILE_TYPE_DIRECTORY', symlink: 'FILE_TYPE_SYMLINK', other: 'FILE_TYPE_UNSPECIFIED' } as const;

/**
 * envd's EntryInfo in proto3 JSON (int64 size as a string). A symlink is described as envd
 * does: the type and mode of what it resolves to, `symlinkTarget` the absolute path it
 * resolves to (a dangling one: type unspecified, the raw target).
 */
export function entryInfo(e: FileEntry, metadata: Record<string, string> | undefined) {
  const link = e.type === 'symlink';
  return {
    name: e.name,
    type: link ? (e.resolved ? TYPE[e.resolved.type] : TYPE.other) : TYPE[e.type],
    path: e.path,
    size: String(e.sizeBytes),
    mode: link && e.resolved ? e.resolved.mode : e.mode,
    permissions: e.permissions,
    owner: e.owner,
    group: e.group,
    modifiedTime: e.modifiedAt,
    ...(link ? { symlinkTarget: e.resolved?.path ?? e.symlinkTarget } : {}),
    ...(metadata ? { metadata } : {}),
  };
}

/** envd's filesystem service over rollbox's files API (stat, list, mkdir, move, remove), with E2B's file metadata. */
export function filesystemService(files: E2bFilesApi, metadata: FileMetadata) {
  const at = async (call: EnvdCall, p: string) => resolvePath(p, call.user, await call.sandbox());
  const described = async (call: EnvdCall, entries: FileEntry[]) => {
    const meta = await metadata.of(call.sandboxId, entries.map((e) => e.path));
    return entries.map((e) => entryInfo(e, meta.get(e.path)));
  };
  return {
    async Stat(c: Context, call: EnvdCall): Promise<Response> {
      const { path } = await readUnary(c, E2bPathRequest);
      const [entry] = await described(call, [await call.guard(files.stat(call.principal, call.sandboxId, await at(call, path)))]);
      return c.json({ entry }, 200);
    },
    async ListDir(c: Context, call: EnvdCall): Promise<Response> {
      const { path, depth } = await readUnary(c, E2bListDirRequest);
      const entries = await call.guard(files.list(call.principal, call.sandboxId, await at(call, path), Math.max(1, depth ?? 1)));
      return c.json({ entries: await described(call, entries) }, 200);
    },
    async MakeDir(c: Context, call: EnvdCall): Promise<Response> {
      const { path } = await readUnary(c, E2bPathRequest);
      const made = await call.guard(files.makeDir(call.principal, call.sandboxId, await at(call, path)));
      if (!made.created) throw new ConnectError('already_exists', `directory ${made.entry.path} already exists`);
      return c.json({ entry: entryInfo(made.entry, undefined) }, 200);
    },
    async Move(c: Context, call: EnvdCall): Promise<Response> {
      const { source, destination } = await readUnary(c, E2bMoveRequest);
      const [from, to] = await Promise.all([at(call, source), at(call, destination)]);
      const moved = await call.guard(files.move(call.principal, call.sandboxId, from, to));
      await metadata.move(call.sandboxId, from, moved.path);
      const [entry] = await described(call, [moved]);
      return c.json({ entry }, 200);
    },
    async Remove(c: Context, call: EnvdCall): Promise<Response> {
      const { path } = await readUnary(c, E2bPathRequest);
      const target = await at(call, path);
      await call.guard(files.remove(call.principal, call.sandboxId, target));
      await metadata.remove(call.sandboxId, target);
      return c.json({}, 200);
    },
  };
}

import type { Context } from 'hono';
import { E2bListDirRequest, E2bMoveRequest, E2bPathRequest, type FileEntry } from '../../api/index.ts';
import type { FilesService } from '../files-service.ts';
import { ConnectError, readUnary } from './connect.ts';
import { resolvePath, type EnvdCall } from './envd-common.ts';

export type E2bFilesApi = Pick<FilesService, 'read' | 'write' | 'stat' | 'list' | 'makeDir' | 'move' | 'remove'>;

const TYPE = { file: 'FILE_TYPE_FILE', directory: 'FILE_TYPE_DIRECTORY', symlink: 'FILE_TYPE_SYMLINK', other: 'FILE_TYPE_UNSPECIFIED' } as const;

/** envd's EntryInfo in proto3 JSON (int64 size as a string). */
function entryInfo(e: FileEntry) {
  return {
    name: e.name,
    type: TYPE[e.type],
    path: e.path,
    size: String(e.sizeBytes),
    mode: e.mode,
    permissions: e.permissions,
    owner: e.owner,
    group: e.group,
    modifiedTime: e.modifiedAt,
    ...(e.symlinkTarget ? { symlinkTarget: e.symlinkTarget } : {}),
  };
}

/** envd's filesystem service over rollbox's files API (stat, list, mkdir, move, remove). */
export function filesystemService(files: E2bFilesApi) {
  const at = (call: EnvdCall, p: string) => resolvePath(p, call.user);
  return {
    async Stat(c: Context, call: EnvdCall): Promise<Response> {
      const { path } = await readUnary(c, E2bPathRequest);
      return c.json({ entry: entryInfo(await call.guard(files.stat(call.principal, call.sandboxId, at(call, path)))) }, 200);
    },
    async ListDir(c: Context, call: EnvdCall): Promise<Response> {
      const { path, depth } = await readUnary(c, E2bListDirRequest);
      const entries = await call.guard(files.list(call.principal, call.sandboxId, at(call, path), Math.max(1, depth ?? 1)));
      return c.json({ entries: entries.map(entryInfo) }, 200);
    },
    async MakeDir(c: Context, call: EnvdCall): Promise<Response> {
      const { path } = await readUnary(c, E2bPathRequest);
      const made = await call.guard(files.makeDir(call.principal, call.sandboxId, at(call, path)));
      if (!made.created) throw new ConnectError('already_exists', `directory ${made.entry.path} already exists`);
      return c.json({ entry: entryInfo(made.entry) }, 200);
    },
    async Move(c: Context, call: EnvdCall): Promise<Response> {
      const { source, destination } = await readUnary(c, E2bMoveRequest);
      return c.json({ entry: entryInfo(await call.guard(files.move(call.principal, call.sandboxId, at(call, source), at(call, destination)))) }, 200);
    },
    async Remove(c: Context, call: EnvdCall): Promise<Response> {
      const { path } = await readUnary(c, E2bPathRequest);
      await call.guard(files.remove(call.principal, call.sandboxId, at(call, path)));
      return c.json({}, 200);
    },
  };
}

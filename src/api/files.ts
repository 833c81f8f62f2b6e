import { z } from 'zod';

/** A path inside the sandbox, resolved in the sandbox's own root (never the host's). */
const SandboxFilePath = z
  .string()
  .startsWith('/', 'must be an absolute path inside the sandbox')
  .max(4096)
  .refine((p) => !p.includes('\0'), 'must not contain NUL');

export const FilesReadQuery = z.strictObject({
  path: SandboxFilePath,
  /** auto: a regular file comes back as its bytes, a directory as a tar. tar: always a tar. */
  format: z.enum(['auto', 'tar']).default('auto'),
});
export type FilesReadQuery = z.infer<typeof FilesReadQuery>;

export const FilesWriteQuery = z.strictObject({
  path: SandboxFilePath,
  /** Octal mode of a written file (not for tars, whose entries carry their own). */
  mode: z.string().regex(/^[0-7]{3,4}$/, 'mode is octal, e.g. 0644').optional(),
  /** A user of the sandbox (its own /etc/passwd): the file, and the parent directories made for it, become that user's (default root). */
  owner: z.string().regex(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$/, 'owner is a user name or uid').optional(),
});
export type FilesWriteQuery = z.infer<typeof FilesWriteQuery>;

/** The answer to a PUT. */
export const FilesWriteResult = z.object({ path: z.string(), kind: z.enum(['file', 'directory']), sizeBytes: z.number().int() });
export type FilesWriteResult = z.infer<typeof FilesWriteResult>;

export const FILES_TAR_TYPE = 'application/x-tar';
export const FILES_BYTES_TYPE = 'application/octet-stream';

/** One entry as `stat` sees it (symlinks not followed). */
export const FileEntry = z.object({
  name: z.string(),
  path: z.string(),
  type: z.enum(['file', 'directory', 'symlink', 'other']),
  sizeBytes: z.number().int(),
  /** Permission bits (e.g. 0o644 = 420), without the file type. */
  mode: z.number().int(),
  /** As `ls -l` prints them: `-rw-r--r--`. */
  permissions: z.string(),
  owner: z.string(),
  group: z.string(),
  modifiedAt: z.string(),
  symlinkTarget: z.string().optional(),
  /** A symlink that resolves: the absolute path it leads to (every link on the way followed), and what is there. */
  resolved: z.object({ path: z.string(), type: z.enum(['file', 'directory', 'symlink', 'other']), mode: z.number().int() }).optional(),
});
export type FileEntry = z.infer<typeof FileEntry>;

export const FilesPathQuery = z.strictObject({ path: SandboxFilePath });
export type FilesPathQuery = z.infer<typeof FilesPathQuery>;

export const FilesListQuery = z.strictObject({
  path: SandboxFilePath,
  /** 1: the directory's own entries; more: their subdirectories' too, that deep. */
  depth: z.coerce.number().int().min(1).max(32).default(1),
});
export type FilesListQuery = z.infer<typeof FilesListQuery>;
export const FilesList = z.object({ entries: z.array(FileEntry) });
export type FilesList = z.infer<typeof FilesList>;

export const MakeDirRequest = z.strictObject({ path: SandboxFilePath });
export type MakeDirRequest = z.infer<typeof MakeDirRequest>;
/** `created: false`: the directory was there already (parents are created as `mkdir -p` does). */
export const MakeDirResult = z.object({ entry: FileEntry, created: z.boolean() });
export type MakeDirResult = z.infer<typeof MakeDirResult>;

export const MoveRequest = z.strictObject({ source: SandboxFilePath, destination: SandboxFilePath });
export type MoveRequest = z.infer<typeof MoveRequest>;
export const MoveResult = z.object({ entry: FileEntry });

/** `removed: false`: nothing was at the path (removing is idempotent). */
export const RemoveResult = z.object({ path: z.string(), removed: z.boolean() });
export type RemoveResult = z.infer<typeof RemoveResult>;

/** What a worker host does for the stat/list/mkdir/move/remove routes. */
export const FilesMetaAction = z.discriminatedUnion('action', [
  z.object({ action: z.literal('stat'), path: z.string() }),
  z.object({ action: z.literal('list'), path: z.string(), depth: z.number().int() }),
  z.object({ action: z.literal('mkdir'), path: z.string() }),
  z.object({ action: z.literal('move'), path: z.string(), destination: z.string() }),
  z.object({ action: z.literal('remove'), path: z.string() }),
]);
export type FilesMetaAction = z.infer<typeof FilesMetaAction>;

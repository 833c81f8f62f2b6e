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
});
export type FilesWriteQuery = z.infer<typeof FilesWriteQuery>;

/** The answer to a PUT. */
export const FilesWriteResult = z.object({ path: z.string(), kind: z.enum(['file', 'directory']), sizeBytes: z.number().int() });
export type FilesWriteResult = z.infer<typeof FilesWriteResult>;

export const FILES_TAR_TYPE = 'application/x-tar';
export const FILES_BYTES_TYPE = 'application/octet-stream';

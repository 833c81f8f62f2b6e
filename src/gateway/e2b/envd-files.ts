import { gunzipSync } from 'node:zlib';
import type { Context } from 'hono';
import { RollboxError } from '../../api/index.ts';
import { resolvePath, type EnvdCall } from './envd-common.ts';
import type { E2bFilesApi } from './envd-filesystem.ts';
import { metadataOfHeaders, type FileMetadata } from './file-metadata.ts';

const userParam = (c: Context, call: EnvdCall) => c.req.query('username') || call.user;

/**
 * envd's `GET /files` and `POST /files` (raw `application/octet-stream`, or multipart
 * with every part named `file`, its path the `path` parameter or else the part's
 * filename) over rollbox's files API: parents are created, a file is overwritten, and
 * both become the user's the call names (else the sandbox's own user), as envd writes
 * them. `X-Metadata-*` headers are the files' metadata (envd 0.6.2).
 */
export function filesRoutes(files: E2bFilesApi, metadata: FileMetadata) {
  return {
    async read(c: Context, call: EnvdCall): Promise<Response> {
      const given = c.req.query('path');
      if (!given) throw new RollboxError('invalid_request', 'path is required');
      const path = resolvePath(given, userParam(c, call), await call.sandbox());
      const { body, tar } = await call.guard(files.read(call.principal, call.sandboxId, { path, format: 'auto' }));
      if (tar) throw new RollboxError('invalid_request', `${path} is a directory`);
      return c.body(new Uint8Array(body), 200, { 'content-type': 'application/octet-stream', 'content-disposition': 'inline' });
    },

    async write(c: Context, call: EnvdCall): Promise<Response> {
      const user = userParam(c, call);
      const sandbox = await call.sandbox();
      const owner = user ?? sandbox.spec.user;
      const meta = metadataOfHeaders(c.req.header());
      const type = (c.req.header('content-type') ?? '').split(';')[0]!.trim().toLowerCase();
      const uploads: { path: string; bytes: Buffer }[] = [];
      if (type === 'multipart/form-data') {
        const form = await c.req.parseBody({ all: true });
        const parts = ([] as unknown[]).concat(form.file ?? []).filter((p): p is File => p instanceof File);
        if (parts.length === 0) throw new RollboxError('invalid_request', 'no part named file in the form');
        for (const part of parts) {
          const given = c.req.query('path') || part.name;
          if (!given) throw new RollboxError('invalid_request', 'a part has no filename and there is no path parameter');
          uploads.push({ path: resolvePath(given, user, sandbox), bytes: Buffer.from(await part.arrayBuffer()) });
        }
      } else {
        const given = c.req.query('path');
        if (!given) throw new RollboxError('invalid_request', 'path is required for an octet-stream upload');
        let bytes = Buffer.from(await c.req.arrayBuffer());
        if ((c.req.header('content-encoding') ?? '').toLowerCase() === 'gzip') {
          try {
            bytes = gunzipSync(bytes);
          } catch {
            throw new RollboxError('invalid_request', 'Content-Encoding says gzip and the body is not');
          }
        }
        uploads.push({ path: resolvePath(given, user, sandbox), bytes });
      }
      const written = [];
      for (const upload of uploads) {
        // Root's files are root's already (the files API writes as root).
        const query = { path: upload.path, ...(owner && owner !== 'root' && owner !== '0' ? { owner: owner.split(':')[0]! } : {}) };
        await call.guard(files.write(call.principal, call.sandboxId, query, upload.bytes, 'application/octet-stream'));
        if (meta) await metadata.set(call.sandboxId, upload.path, meta);
        written.push({ path: upload.path, name: upload.path.slice(upload.path.lastIndexOf('/') + 1), type: 'file', ...(meta ? { metadata: meta } : {}) });
      }
      return c.json(written, 200);
    },
  };
}

import { createRoute, z } from '@hono/zod-openapi';
import { FILES_BYTES_TYPE, FILES_TAR_TYPE, FilesReadQuery, FilesWriteQuery, FilesWriteResult } from '../../api/index.ts';
import type { FilesService } from '../files-service.ts';
import { IdParam, errors, json, security, type GatewayApp } from './common.ts';

/** What the files routes need of the files service. */
export type FilesApi = Pick<FilesService, 'read' | 'write'>;

const binary = (description: string) => ({
  description,
  content: { [FILES_BYTES_TYPE]: { schema: z.string().openapi({ format: 'binary' }) }, [FILES_TAR_TYPE]: { schema: z.string().openapi({ format: 'binary' }) } },
});

/** Files in a running sandbox; paths resolve inside the sandbox (src/workers/files.ts). */
export function registerFilesRoutes(app: GatewayApp, files: FilesApi): void {
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/sandboxes/{id}/files',
      security,
      request: { params: IdParam, query: FilesReadQuery },
      responses: {
        200: binary(`a regular file as its bytes (${FILES_BYTES_TYPE}); a directory, or anything with format=tar or Accept: ${FILES_TAR_TYPE}, as a tar`),
        ...errors('not_found', 'invalid_state', 'payload_too_large', 'timeout'),
      },
    }),
    async (c) => {
      const query = c.req.valid('query');
      const accept = c.req.header('accept') ?? '';
      const format = accept.includes(FILES_TAR_TYPE) && !accept.includes(FILES_BYTES_TYPE) ? 'tar' : query.format;
      const { body, tar } = await files.read(c.get('principal'), c.req.valid('param').id, { ...query, format });
      return c.body(body as Uint8Array<ArrayBuffer>, 200, { 'content-type': tar ? FILES_TAR_TYPE : FILES_BYTES_TYPE }) as never; // binary, outside the JSON response types
    },
  );
  app.openapi(
    createRoute({
      method: 'put',
      path: '/v1/sandboxes/{id}/files',
      security,
      request: { params: IdParam, query: FilesWriteQuery, body: { required: true, ...binary(`${FILES_TAR_TYPE}: extracted into the directory at path; anything else: written as the file at path`) } },
      responses: { 200: json(FilesWriteResult, 'written'), ...errors('not_found', 'invalid_state', 'payload_too_large', 'invalid_archive', 'timeout') },
    }),
    async (c) => {
      const body = Buffer.from(await c.req.arrayBuffer());
      return c.json(await files.write(c.get('principal'), c.req.valid('param').id, c.req.valid('query'), body, c.req.header('content-type')), 200);
    },
  );
}

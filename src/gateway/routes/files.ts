import { createRoute, z } from '@hono/zod-openapi';
import {
  FILES_BYTES_TYPE,
  FILES_TAR_TYPE,
  FileEntry,
  FilesList,
  FilesListQuery,
  FilesPathQuery,
  FilesReadQuery,
  FilesWriteQuery,
  FilesWriteResult,
  MakeDirRequest,
  MakeDirResult,
  MoveRequest,
  MoveResult,
  RemoveResult,
} from '../../api/index.ts';
import type { FilesService } from '../files-service.ts';
import { IdParam, errors, json, jsonBody, security, type GatewayApp } from './common.ts';

/** What the files routes need of the files service. */
export type FilesApi = Pick<FilesService, 'read' | 'write' | 'stat' | 'list' | 'makeDir' | 'move' | 'remove'>;

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
  registerFilesMetaRoutes(app, files);
}

/** stat, list, mkdir, move, remove: JSON answers, symlinks not followed. */
function registerFilesMetaRoutes(app: GatewayApp, files: FilesApi): void {
  const fileErrors = errors('not_found', 'invalid_state', 'timeout');
  app.openapi(
    createRoute({ method: 'get', path: '/v1/sandboxes/{id}/files/stat', security, request: { params: IdParam, query: FilesPathQuery }, responses: { 200: json(FileEntry, 'the entry at path'), ...fileErrors } }),
    async (c) => c.json(await files.stat(c.get('principal'), c.req.valid('param').id, c.req.valid('query').path), 200),
  );
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/sandboxes/{id}/files/list',
      security,
      request: { params: IdParam, query: FilesListQuery },
      responses: { 200: json(FilesList, 'the entries under a directory, to depth'), ...errors('not_found', 'invalid_state', 'timeout', 'payload_too_large') },
    }),
    async (c) => {
      const { path, depth } = c.req.valid('query');
      return c.json({ entries: await files.list(c.get('principal'), c.req.valid('param').id, path, depth) }, 200);
    },
  );
  app.openapi(
    createRoute({ method: 'post', path: '/v1/sandboxes/{id}/files/mkdir', security, request: { params: IdParam, body: jsonBody(MakeDirRequest) }, responses: { 200: json(MakeDirResult, 'the directory (created: false when it was there)'), ...fileErrors } }),
    async (c) => c.json(await files.makeDir(c.get('principal'), c.req.valid('param').id, c.req.valid('json').path), 200),
  );
  app.openapi(
    createRoute({ method: 'post', path: '/v1/sandboxes/{id}/files/move', security, request: { params: IdParam, body: jsonBody(MoveRequest) }, responses: { 200: json(MoveResult, 'the entry at its new path'), ...fileErrors } }),
    async (c) => {
      const { source, destination } = c.req.valid('json');
      return c.json({ entry: await files.move(c.get('principal'), c.req.valid('param').id, source, destination) }, 200);
    },
  );
  app.openapi(
    createRoute({ method: 'delete', path: '/v1/sandboxes/{id}/files', security, request: { params: IdParam, query: FilesPathQuery }, responses: { 200: json(RemoveResult, 'removed (removed: false when nothing was there)'), ...fileErrors } }),
    async (c) => c.json(await files.remove(c.get('principal'), c.req.valid('param').id, c.req.valid('query').path), 200),
  );
}

import { stat } from 'node:fs/promises';
import { createRoute, z } from '@hono/zod-openapi';
import type { Context } from 'hono';
import rangeParser from 'range-parser';
import { Layer, LayerChunkTable, LayerList, LayerName, RollboxError, UploadLayerQuery } from '../../api/index.ts';
import { readerOf, requireScope } from '../../iam/index.ts';
import { CHUNK_ENCODING_HEADER, filePieces, type GzippedChunks, type LayerBuilder, type LayerStore } from '../../layers/index.ts';
import type { LayerReads } from '../layer-reads.ts';
import type { GatewayEnv } from '../auth.ts';
import type { LayerRegistry } from '../../registry/index.ts';
import { describeZodError } from '../errors.ts';
import { errors, json, requireLayerRead, security, withUploadBody, type GatewayApp } from './common.ts';

export type { LayerBuilder };

export interface LayerRouteDeps {
  layers: Pick<LayerRegistry, 'register' | 'list' | 'resolve' | 'unname' | 'publish' | 'unpublish'>;
  buildLayer: LayerBuilder;
  /** The layer store this gateway serves layers from (the origin of hosts without it). */
  store: Pick<LayerStore, 'locate' | 'chunkTable'>;
  uploadLimitBytes: number;
  /** Byte ranges of a blob gzipped, for a client that accepts gzip (none: always sent as stored). */
  gzippedChunks?: Pick<GzippedChunks, 'range'>;
  /** Streams the files, within its caps on reads at once. */
  reads: LayerReads;
  now: () => number;
}

/**
 * A stored file, whole or the one byte range a `Range` header asks for (206 with
 * Content-Range; 416 past the end). Hosts reading a lazy layer fetch its chunks this way:
 * with `gzipLevel` and a client that asks with `X-Rollbox-Chunk-Encoding: gzip`, the
 * range goes gzipped, said by the same header in the answer (Content-Range names the
 * stored bytes; the client decodes and checks each chunk's digest). Not Content-Encoding:
 * Node's fetch decodes that itself and, on a corrupted stream, leaves the body hanging
 * instead of failing it. A layer's data is mostly binaries and libraries, which gzip at
 * level 1 cuts to about a third (bench:lazy: 0.36).
 *
 * Whole or ranged, the bytes go in pieces of a chunk, read as the socket takes them, within
 * the caps of `reads` (layer-reads.ts); gzipped ones come from `gzipped` (the blob's
 * chunks are gzipped once and kept: gzipped-chunks.ts).
 */
async function serveFile(c: Context<GatewayEnv>, filePath: string, reads: LayerReads, gzipped?: (start: number, end: number) => AsyncGenerator<Buffer>): Promise<Response> {
  const sizeBytes = await stat(filePath).then((s) => s.size, () => undefined);
  if (sizeBytes === undefined) throw new RollboxError('not_found', 'the layer was removed from the store meanwhile');
  c.header('Content-Type', 'application/octet-stream');
  c.header('Accept-Ranges', 'bytes');
  const header = c.req.header('range');
  const ranges = header === undefined ? undefined : rangeParser(sizeBytes, header, { combine: true });
  if (ranges === -1) {
    c.header('Content-Range', `bytes */${sizeBytes}`);
    throw new RollboxError('range_not_satisfiable', `range ${header} is past the end of ${sizeBytes} bytes`);
  }
  // A HEAD takes no read slot: Hono answers it from the GET's headers and drops the body unread.
  const send = async (pieces: () => AsyncGenerator<Buffer>, status: 200 | 206): Promise<Response> => (c.req.method === 'HEAD' ? c.body(null, status) : c.body(await reads.body(c, pieces), status));
  // A malformed header, another unit or several ranges: the whole file (RFC 9110 allows ignoring Range).
  if (ranges === undefined || ranges === -2 || ranges.type !== 'bytes' || ranges.length !== 1) {
    c.header('Content-Length', String(sizeBytes));
    return send(() => filePieces(filePath, 0, sizeBytes), 200);
  }
  const { start, end } = ranges[0]!;
  c.header('Content-Range', `bytes ${start}-${end}/${sizeBytes}`);
  if (gzipped && c.req.header(CHUNK_ENCODING_HEADER) === 'gzip') {
    c.header(CHUNK_ENCODING_HEADER, 'gzip');
    c.header('Vary', CHUNK_ENCODING_HEADER);
    return send(() => gzipped(start, end), 206);
  }
  c.header('Content-Length', String(end - start + 1));
  return send(() => filePieces(filePath, start, end - start + 1), 206);
}

/**
 * Layers: a tar goes in, a content-addressed EROFS layer comes out; list, read, unname, and
 * the layer's files for hosts without the layer store: the data blob (`Range` answered),
 * and of a split layer its metadata image and chunk table. Each route sees the caller's
 * own layers and the published ones (readerOf): another tenant's answer 404. An admin
 * publishes a layer cluster-wide (`PUT /v1/layers/:ref/published`) and takes it back.
 */
export function registerLayerRoutes(app: GatewayApp, deps: LayerRouteDeps): void {
  // A streamed body (not JSON): outside the OpenAPI routes, validated here.
  app.post('/v1/layers', async (c) => {
    requireScope(c.get('principal'), 'layer:write');
    const query = UploadLayerQuery.safeParse(c.req.query());
    if (!query.success) throw new RollboxError('invalid_request', describeZodError(query.error, 'query'));
    const declared = Number(c.req.header('content-length') ?? NaN);
    const built = await withUploadBody(c, 'a tar archive', async (body) => {
      if (declared > deps.uploadLimitBytes) throw new RollboxError('payload_too_large', `layer tar is larger than ${deps.uploadLimitBytes} bytes`);
      return deps.buildLayer(body, { maxBytes: deps.uploadLimitBytes });
    });
    const layer = await deps.layers.register({ digest: built.digest, sizeBytes: built.sizeBytes, name: query.data.name, parents: [], createdAt: new Date(deps.now()).toISOString() }, c.get('principal').tenant);
    return c.json(layer, 201);
  });
  app.openapi(createRoute({ method: 'get', path: '/v1/layers', security, responses: { 200: json(LayerList, 'registered layers'), ...errors() } }), async (c) => {
    requireLayerRead(c.get('principal'));
    return c.json({ layers: await deps.layers.list(readerOf(c.get('principal'))) }, 200);
  });
  app.openapi(
    createRoute({ method: 'get', path: '/v1/layers/{ref}', security, request: { params: z.object({ ref: z.string().max(140) }) }, responses: { 200: json(Layer, 'a layer by digest or name'), ...errors('not_found') } }),
    async (c) => {
      requireLayerRead(c.get('principal'));
      return c.json(await deps.layers.resolve(c.req.valid('param').ref, readerOf(c.get('principal'))), 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'delete',
      path: '/v1/layers/{name}',
      security,
      request: { params: z.object({ name: LayerName }) },
      responses: { 200: json(Layer, 'the layer without that name; once nothing references it, garbage collection removes it after the grace period'), ...errors('not_found') },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'layer:write');
      return c.json(await deps.layers.unname(c.req.valid('param').name, readerOf(c.get('principal'))), 200);
    },
  );
  const PublishParams = z.object({ ref: z.string().max(140) });
  app.openapi(
    createRoute({
      method: 'put',
      path: '/v1/layers/{ref}/published',
      security,
      request: { params: PublishParams },
      responses: { 200: json(Layer, 'the layer, published cluster-wide: every tenant sees, forks and reads it (by digest, and by the name given as ref)'), ...errors('not_found') },
    }),
    async (c) => {
      const principal = c.get('principal');
      requireScope(principal, 'admin');
      const { ref } = c.req.valid('param');
      const layer = await deps.layers.resolve(ref, readerOf(principal));
      return c.json(await deps.layers.publish(layer.digest, ref === layer.digest ? undefined : ref), 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'delete',
      path: '/v1/layers/{ref}/published',
      security,
      request: { params: PublishParams },
      responses: { 200: json(Layer, 'the layer, no longer published: its cluster names go, and only the tenants that stored it see it'), ...errors('not_found') },
    }),
    async (c) => {
      const principal = c.get('principal');
      requireScope(principal, 'admin');
      const layer = await deps.layers.resolve(c.req.valid('param').ref, readerOf(principal));
      return c.json(await deps.layers.unpublish(layer.digest), 200);
    },
  );
  const filesOf = async (c: Context<GatewayEnv>) => {
    requireLayerRead(c.get('principal'));
    const layer = await deps.layers.resolve(c.req.param('ref') ?? '', readerOf(c.get('principal')));
    const files = await deps.store.locate(layer.digest);
    if (!files) throw new RollboxError('not_found', `layer ${layer.digest} has no files in this gateway's store`);
    return files;
  };
  const splitOnly = (digest: string): never => {
    throw new RollboxError('not_found', `layer ${digest} is a single EROFS image (GET /v1/layers/${digest}/blob is all of it): it has no metadata image or chunk table`);
  };
  // Binary bodies, outside the OpenAPI routes: the blob (a split layer's data, or a
  // single-image layer's image) and a split layer's metadata image.
  app.get('/v1/layers/:ref/blob', async (c) => {
    const files = await filesOf(c);
    const filePath = files.blobPath ?? files.imagePath;
    const { gzippedChunks } = deps;
    return serveFile(c, filePath, deps.reads, gzippedChunks && ((start, end) => gzippedChunks.range(files.digest, filePath, start, end)));
  });
  app.get('/v1/layers/:ref/meta', async (c) => {
    const files = await filesOf(c);
    return files.blobPath ? serveFile(c, files.imagePath, deps.reads) : splitOnly(files.digest);
  });
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/layers/{ref}/chunks',
      security,
      request: { params: z.object({ ref: z.string().max(140) }) },
      responses: { 200: json(LayerChunkTable, "a split layer's chunk table, the bytes whose sha256 is its digest"), ...errors('not_found') },
    }),
    async (c) => {
      const files = await filesOf(c);
      const table = await deps.store.chunkTable(files.digest);
      if (!table) return splitOnly(files.digest);
      // The stored bytes as they are: a client checks their sha256 against the digest.
      return c.body(new Uint8Array(table), 200, { 'Content-Type': 'application/json' }) as never;
    },
  );
}

import { createReadStream } from 'node:fs';
import { Readable } from 'node:stream';
import { createRoute, z } from '@hono/zod-openapi';
import { Layer, LayerList, LayerName, RollboxError, UploadLayerQuery } from '../../api/index.ts';
import { requireScope } from '../../iam/index.ts';
import type { LayerBuilder } from '../../layers/index.ts';
import type { LayerRegistry } from '../../registry/index.ts';
import { describeZodError } from '../errors.ts';
import { errors, json, requireLayerRead, security, withUploadBody, type GatewayApp } from './common.ts';

export type { LayerBuilder };

export interface LayerRouteDeps {
  layers: Pick<LayerRegistry, 'register' | 'list' | 'resolve' | 'unname'>;
  buildLayer: LayerBuilder;
  /** Path of a layer image in the store, for the blob download. */
  layerImagePath: (digest: string) => Promise<string | undefined>;
  uploadLimitBytes: number;
  now: () => number;
}

/** Layers: a tar goes in, a content-addressed EROFS layer comes out; list, read, download, unname. */
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
    const layer = await deps.layers.register({ digest: built.digest, sizeBytes: built.sizeBytes, name: query.data.name, parents: [], createdAt: new Date(deps.now()).toISOString() });
    return c.json(layer, 201);
  });
  app.openapi(createRoute({ method: 'get', path: '/v1/layers', security, responses: { 200: json(LayerList, 'registered layers'), ...errors() } }), async (c) => {
    requireLayerRead(c.get('principal'));
    return c.json({ layers: await deps.layers.list() }, 200);
  });
  app.openapi(
    createRoute({ method: 'get', path: '/v1/layers/{ref}', security, request: { params: z.object({ ref: z.string().max(140) }) }, responses: { 200: json(Layer, 'a layer by digest or name'), ...errors('not_found') } }),
    async (c) => {
      requireLayerRead(c.get('principal'));
      return c.json(await deps.layers.resolve(c.req.valid('param').ref), 200);
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
      return c.json(await deps.layers.unname(c.req.valid('param').name), 200);
    },
  );
  app.get('/v1/layers/:ref/blob', async (c) => {
    requireLayerRead(c.get('principal'));
    const layer = await deps.layers.resolve(c.req.param('ref'));
    const imagePath = await deps.layerImagePath(layer.digest);
    if (!imagePath) throw new RollboxError('not_found', `layer ${layer.digest} has no image in this gateway's store`);
    c.header('Content-Type', 'application/octet-stream');
    c.header('Content-Length', String(layer.sizeBytes));
    return c.body(Readable.toWeb(createReadStream(imagePath)) as ReadableStream);
  });
}

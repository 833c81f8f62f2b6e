import type { Readable } from 'node:stream';
import { createRoute, z } from '@hono/zod-openapi';
import { Image, ImageList, ImageName, ImportImageQuery, RollboxError, type ImportedImage } from '../../api/index.ts';
import { requireScope } from '../../iam/index.ts';
import type { ImageRegistry } from '../../registry/index.ts';
import { describeZodError } from '../errors.ts';
import { errors, json, requireLayerRead, security, withUploadBody, type GatewayApp } from './common.ts';

export interface ImageRouteDeps {
  images: Pick<ImageRegistry, 'list' | 'getOrThrow' | 'delete'>;
  importImage: (archive: Readable, query: ImportImageQuery) => Promise<ImportedImage>;
  /** Digests of the cloud pool's pre-synced layers: an image all of whose layers are in it may burst. */
  syncedLayers: () => Promise<ReadonlySet<string>>;
}

/** Images: a `docker save` archive or an OCI layout goes in as one stream; records of layers and config come out. */
export function registerImageRoutes(app: GatewayApp, deps: ImageRouteDeps): void {
  const withSynced = async (images: Image[]): Promise<Image[]> => {
    const synced = await deps.syncedLayers();
    return images.map((i) => ({ ...i, synced: i.layers.every((l) => synced.has(l.digest)) }));
  };
  // A streamed body of any size (each layer is capped on its own): outside the OpenAPI routes, validated here.
  app.post('/v1/images', async (c) => {
    requireScope(c.get('principal'), 'layer:write');
    const query = ImportImageQuery.safeParse(c.req.query());
    if (!query.success) throw new RollboxError('invalid_request', describeZodError(query.error, 'query'));
    const imported = await withUploadBody(c, 'a docker save archive or an OCI image layout (tar)', (body) => deps.importImage(body, query.data));
    const [withState] = await withSynced([imported]);
    return c.json({ ...imported, synced: withState!.synced }, 201);
  });
  app.openapi(createRoute({ method: 'get', path: '/v1/images', security, responses: { 200: json(ImageList, 'imported images'), ...errors() } }), async (c) => {
    requireLayerRead(c.get('principal'));
    return c.json({ images: await withSynced(await deps.images.list()) }, 200);
  });
  app.openapi(
    createRoute({ method: 'get', path: '/v1/images/{name}', security, request: { params: z.object({ name: ImageName }) }, responses: { 200: json(Image, 'an image: its layers lowest first and its config'), ...errors('not_found') } }),
    async (c) => {
      requireLayerRead(c.get('principal'));
      const [image] = await withSynced([await deps.images.getOrThrow(c.req.valid('param').name)]);
      return c.json(image!, 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'delete',
      path: '/v1/images/{name}',
      security,
      request: { params: z.object({ name: ImageName }) },
      responses: { 200: json(Image, 'the removed record; its layers stay while sandboxes, snapshots or other images use them, then garbage collection takes them'), ...errors('not_found') },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'layer:write');
      return c.json(await deps.images.delete(c.req.valid('param').name), 200);
    },
  );
}

import type { Readable } from 'node:stream';
import { createRoute, z } from '@hono/zod-openapi';
import { ImageCheck, ImageCheckRequest, ImageList, ImageName, ImageRecord, ImportImageQuery, PullImageRequest, RollboxError, type ImportedImage } from '../../api/index.ts';
import { readerOf, requireScope, type Principal } from '../../iam/index.ts';
import type { Reader } from '../../registry/index.ts';
import { describeZodError } from '../errors.ts';
import { errors, json, jsonBody, requireLayerRead, security, withUploadBody, type GatewayApp } from './common.ts';

export interface ImageRouteDeps {
  /** Image records (an image and its latest pull) and pulls: src/images ImagePulls. */
  records: {
    list(reader: Reader): Promise<ImageRecord[]>;
    record(name: string, reader: Reader): Promise<ImageRecord>;
    delete(name: string, reader: Reader): Promise<ImageRecord>;
    request(request: PullImageRequest, owner: string): Promise<ImageRecord>;
    publish(name: string, reader: Reader): Promise<ImageRecord>;
  };
  /** Into the owner's images. */
  importImage: (archive: Readable, query: ImportImageQuery, owner: string) => Promise<ImportedImage>;
  /** Image checks (src/image-checks): start one, read one (settled from its batch). */
  checks: {
    start(principal: Principal, name: string, request: ImageCheckRequest): Promise<ImageCheck>;
    get(principal: Principal, name: string): Promise<ImageCheck | undefined>;
  };
  /** Digests of the cloud pool's pre-synced layers: an image all of whose layers are in it may burst. */
  syncedLayers: () => Promise<ReadonlySet<string>>;
}

/** Images: a `docker save` archive or an OCI layout goes in as one stream, or is pulled from a registry; records of layers and config come out. */
export function registerImageRoutes(app: GatewayApp, deps: ImageRouteDeps): void {
  const withSynced = async <T extends ImageRecord>(images: T[]): Promise<T[]> => {
    const synced = await deps.syncedLayers();
    return images.map((i) => (i.state === 'ready' ? { ...i, synced: i.layers.every((l) => synced.has(l.digest)) } : i));
  };
  // A streamed body of any size (each layer is capped on its own): outside the OpenAPI routes, validated here.
  app.post('/v1/images', async (c) => {
    requireScope(c.get('principal'), 'layer:write');
    const query = ImportImageQuery.safeParse(c.req.query());
    if (!query.success) throw new RollboxError('invalid_request', describeZodError(query.error, 'query'));
    const imported = await withUploadBody(c, 'a docker save archive or an OCI image layout (tar)', (body) => deps.importImage(body, query.data, c.get('principal').tenant));
    const [withState] = await withSynced([imported]);
    return c.json(withState!, 201);
  });
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/images/pull',
      security,
      request: { body: jsonBody(PullImageRequest) },
      responses: { 202: json(ImageRecord, 'the image record at once: `pulling` (a new image), or `ready` with the new pull in `pull` (a name holding an image); it ends `ready` or `failed` with `error`'), ...errors('conflict') },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'layer:write');
      return c.json(await deps.records.request(c.req.valid('json'), c.get('principal').tenant), 202);
    },
  );
  app.openapi(createRoute({ method: 'get', path: '/v1/images', security, responses: { 200: json(ImageList, 'images: imported, pulled, and pulls under way or failed'), ...errors() } }), async (c) => {
    requireLayerRead(c.get('principal'));
    return c.json({ images: await withSynced(await deps.records.list(readerOf(c.get('principal')))) }, 200);
  });
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/images/{name}',
      security,
      request: { params: z.object({ name: ImageName }) },
      responses: { 200: json(ImageRecord, 'an image: its layers lowest first, its config, its state and latest pull (progress while it runs)'), ...errors('not_found') },
    }),
    async (c) => {
      const principal = c.get('principal');
      requireLayerRead(principal);
      const [image] = await withSynced([await deps.records.record(c.req.valid('param').name, readerOf(principal))]);
      const check = image!.state === 'ready' ? await deps.checks.get(principal, image!.name) : undefined;
      return c.json({ ...image!, ...(check ? { check } : {}) }, 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/images/{name}/check',
      security,
      request: { params: z.object({ name: ImageName }), body: jsonBody(ImageCheckRequest) },
      responses: { 202: json(ImageCheck, "the check, `checking`: the untouched task must fail the grade and the reference solution pass it, each run as a task of a batch (`batchId`); it ends `validated` or `invalid` (with `reason`), read at GET /v1/images/{name}/check or in the image's `check`"), ...errors('not_found') },
    }),
    async (c) => c.json(await deps.checks.start(c.get('principal'), c.req.valid('param').name, c.req.valid('json')), 202),
  );
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/images/{name}/check',
      security,
      request: { params: z.object({ name: ImageName }) },
      responses: { 200: json(ImageCheck, "the check of the image's present content (`not_found` when it has none)"), ...errors('not_found') },
    }),
    async (c) => {
      const principal = c.get('principal');
      requireLayerRead(principal);
      const name = c.req.valid('param').name;
      const check = await deps.checks.get(principal, name);
      if (!check) throw new RollboxError('not_found', `image ${name} has no check (POST /v1/images/${name}/check)`);
      return c.json(check, 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'delete',
      path: '/v1/images/{name}',
      security,
      request: { params: z.object({ name: ImageName }) },
      responses: { 200: json(ImageRecord, 'the removed record; its layers stay while sandboxes, snapshots or other images use them, then garbage collection takes them'), ...errors('not_found', 'invalid_state') },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'layer:write');
      return c.json(await deps.records.delete(c.req.valid('param').name, readerOf(c.get('principal'))), 200);
    },
  );
  app.openapi(
    createRoute({
      method: 'put',
      path: '/v1/images/{name}/published',
      security,
      request: { params: z.object({ name: ImageName }) },
      responses: { 200: json(ImageRecord, "the image published cluster-wide (admin): a copy under the cluster's names, its layers published; every tenant without an image of that name creates from it. DELETE /v1/images/{name} by an admin with no image of that name of its own removes it"), ...errors('not_found') },
    }),
    async (c) => {
      requireScope(c.get('principal'), 'admin');
      return c.json(await deps.records.publish(c.req.valid('param').name, readerOf(c.get('principal'))), 200);
    },
  );
}

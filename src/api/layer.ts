import { z } from 'zod';
import { LayerDigest } from './sandbox.ts';

export const LayerName = z.string().regex(/^[a-z0-9][a-z0-9._-]{0,127}$/, 'layer names are [a-z0-9][a-z0-9._-]{0,127}');

export const Layer = z.object({
  digest: LayerDigest,
  name: z.string().optional(),
  sizeBytes: z.number().int(),
  /** Layers this one was built on (lineage), base first. */
  parents: z.array(LayerDigest).default([]),
  createdAt: z.string(),
});
export type Layer = z.infer<typeof Layer>;

export const UploadLayerQuery = z.strictObject({
  name: LayerName.optional(),
});
export type UploadLayerQuery = z.infer<typeof UploadLayerQuery>;

export const LayerList = z.object({ layers: z.array(Layer) });
export type LayerList = z.infer<typeof LayerList>;

const SandboxPath = z.string().startsWith('/', 'must be an absolute path').max(4096).refine((p) => !p.includes('\0') && !p.split('/').includes('..'), 'must not contain NUL or ..');

/** pack_diff: the sandbox's writable layer becomes a new layer on top of its own layers. */
export const SnapshotRequest = z.strictObject({
  name: LayerName.optional(),
  /** Paths left out of the layer (reference answers, caches), with everything under them. */
  exclude: z.array(SandboxPath).max(256).default([]),
});
export type SnapshotRequest = z.infer<typeof SnapshotRequest>;

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

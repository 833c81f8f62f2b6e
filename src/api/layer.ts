import { z } from 'zod';
import { LayerDigest } from './sandbox.ts';

export const LayerName = z.string().regex(/^[a-z0-9][a-z0-9._-]{0,127}$/, 'layer names are [a-z0-9][a-z0-9._-]{0,127}');

export const Layer = z.object({
  digest: LayerDigest,
  /** The caller's name for it (its own, else the cluster's). */
  name: z.string().optional(),
  /** Published cluster-wide by an operator: every tenant sees, forks and reads it. Otherwise only its owners (the tenants that stored it) do. */
  published: z.boolean().optional(),
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

const Sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, 'must be 64 hex digits');

/** The format tag of a split layer's chunk table. */
export const CHUNK_TABLE_FORMAT = 'rollbox.erofs-split.v1';

/**
 * A split layer's identity document (`GET /v1/layers/:digest/chunks`): the layer is an EROFS
 * metadata image (`meta`, all a host needs to mount) plus a data blob (the EROFS device its
 * files' contents live in, read in chunks), and the layer's digest is the sha256 of this
 * document's bytes exactly as stored. The document names the meta's sha256 and every chunk's,
 * so the digest covers the layer's whole content: two layers with the same metadata and other
 * bytes have different digests, and every byte a host fetches is checked before it is used.
 */
export const LayerChunkTable = z.strictObject({
  format: z.literal(CHUNK_TABLE_FORMAT),
  /** Chunk i is blob bytes [i * chunkSizeBytes, min((i + 1) * chunkSizeBytes, blob.sizeBytes)). */
  chunkSizeBytes: z.number().int().min(4096).max(64 * 1024 * 1024),
  meta: z.strictObject({ sha256: Sha256Hex, sizeBytes: z.number().int().min(1) }),
  blob: z.strictObject({ sizeBytes: z.number().int().min(0) }),
  /** sha256 of each chunk of the blob, in order. */
  chunks: z.array(Sha256Hex),
});
export type LayerChunkTable = z.infer<typeof LayerChunkTable>;
export type LayerList = z.infer<typeof LayerList>;

const SandboxPath = z.string().startsWith('/', 'must be an absolute path').max(4096).refine((p) => !p.includes('\0') && !p.split('/').includes('..'), 'must not contain NUL or ..');

/** pack_diff: the sandbox's writable layer becomes a new layer on top of its own layers. */
export const SnapshotRequest = z.strictObject({
  name: LayerName.optional(),
  /** Paths left out of the layer (reference answers, caches), with everything under them. */
  exclude: z.array(SandboxPath).max(256).default([]),
});
export type SnapshotRequest = z.infer<typeof SnapshotRequest>;

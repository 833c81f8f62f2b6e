import { z } from 'zod';
import { LayerName } from './layer.ts';
import { LayerDigest, type CreateSandboxRequest } from './sandbox.ts';

/**
 * Lower layers one sandbox may stack (an image's layers and the create's own together). The
 * overlay mount's options must fit in one page; past this the kernel refuses the mount.
 */
export const MAX_STACK_LAYERS = 40;

/** Image names share the layer names' alphabet: an image name is what `image.base` takes. */
export const ImageName = LayerName;

/** `os/architecture[/variant]`, as in an OCI index (`linux/amd64`, `linux/arm64/v8`). */
export const Platform = z.string().regex(/^[a-z0-9]+\/[a-z0-9_]+(\/[a-z0-9]+)?$/, 'platform is os/architecture[/variant]');

export const ImportImageQuery = z.strictObject({
  name: ImageName,
  /** From a multi-platform index (default `linux/amd64`). */
  platform: Platform.default('linux/amd64'),
  /** Which image of an archive holding several: a tag (`repo:tag`, as in `docker save`'s RepoTags or an OCI `org.opencontainers.image.ref.name`). */
  ref: z.string().min(1).max(256).optional(),
});
export type ImportImageQuery = z.infer<typeof ImportImageQuery>;

/** The parts of an image's config a sandbox uses (names as in the OCI image config). */
export const ImageConfig = z.object({
  Env: z.array(z.string()).default([]),
  WorkingDir: z.string().optional(),
  User: z.string().optional(),
  Entrypoint: z.array(z.string()).optional(),
  Cmd: z.array(z.string()).optional(),
});
export type ImageConfig = z.infer<typeof ImageConfig>;

export const ImageLayer = z.object({
  /** The EROFS layer it became (a layer of the layer API). */
  digest: LayerDigest,
  /** sha256 of the uncompressed layer tar (the config's rootfs.diff_ids entry). */
  diffId: LayerDigest,
  /** Size of the EROFS image. */
  sizeBytes: z.number().int(),
});
export type ImageLayer = z.infer<typeof ImageLayer>;

export const Image = z.object({
  name: ImageName,
  /** The manifest's digest (a docker-save archive of the older format has none: its config's, Docker's image ID). */
  digest: LayerDigest,
  platform: Platform,
  /** Lowest first. */
  layers: z.array(ImageLayer),
  config: ImageConfig,
  /** Sum of the layers' EROFS sizes (layers shared with other images counted here too). */
  sizeBytes: z.number().int(),
  createdAt: z.string(),
  /** Every layer is in the cloud pool's pre-synced set (creates from it may burst). */
  synced: z.boolean().optional(),
});
export type Image = z.infer<typeof Image>;

/** What one import did: which layers it had to build and which it found stored already. */
export const ImportReport = z.object({
  layersBuilt: z.number().int(),
  layersReused: z.number().int(),
  /** Bytes of the archive read. */
  archiveBytes: z.number().int(),
  durationMs: z.number(),
});
export type ImportReport = z.infer<typeof ImportReport>;

export const ImportedImage = Image.extend({ import: ImportReport });
export type ImportedImage = z.infer<typeof ImportedImage>;

export const ImageList = z.object({ images: z.array(Image) });
export type ImageList = z.infer<typeof ImageList>;

/**
 * An imported image's config gives a sandbox its defaults: Env under the request's env,
 * WorkingDir unless the request names one, User unless the request names one. The record
 * keeps the result, so the worker (and a claimed pool sandbox) sees one spec.
 */
export function withImageDefaults(request: CreateSandboxRequest, config: ImageConfig | undefined): CreateSandboxRequest {
  const imageEnv = Object.fromEntries((config?.Env ?? []).flatMap((kv) => {
    const eq = kv.indexOf('=');
    return eq > 0 ? [[kv.slice(0, eq), kv.slice(eq + 1)]] : [];
  }));
  const workdir = request.workdir ?? (config?.WorkingDir?.startsWith('/') ? config.WorkingDir : undefined) ?? '/';
  const user = request.user ?? (config?.User || undefined);
  return { ...request, env: { ...imageEnv, ...request.env }, workdir, ...(user ? { user } : {}) };
}

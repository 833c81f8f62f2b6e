import { z } from 'zod';
import { ImageCheck } from './image-check.ts';
import { LayerName } from './layer.ts';
import { ErrorBody, issuesText } from './common.ts';
import { RollboxError } from './errors.ts';
import { ExecRequest } from './exec.ts';
import { CreateSandboxRequest, ImageRef, LayerDigest, Platform } from './sandbox.ts';

/**
 * Lower layers one sandbox may stack (an image's layers and the create's own together). The
 * overlay mount's options must fit in one page; past this the kernel refuses the mount.
 */
export const MAX_STACK_LAYERS = 40;

/** Image names share the layer names' alphabet: an image name is what `image.base` takes. */
export const ImageName = LayerName;

export const ImportImageQuery = z.strictObject({
  name: ImageName,
  /** From a multi-platform index (default `linux/amd64`). */
  platform: Platform.default('linux/amd64'),
  /** Which image of an archive holding several: a tag (`repo:tag`, as in `docker save`'s RepoTags or an OCI `org.opencontainers.image.ref.name`). */
  ref: z.string().min(1).max(256).optional(),
});
export type ImportImageQuery = z.infer<typeof ImportImageQuery>;

const CreateEnv = CreateSandboxRequest.shape.env.unwrap();

/**
 * An image config's `Env` (`NAME=value` entries) becomes a create's env (withImageDefaults),
 * so it is held to the create's rules (names, no NUL, value and total sizes); each refusal
 * names its entry by index, never by its (foreign) text.
 */
const ImageEnv = z.array(z.string()).superRefine((entries, ctx) => {
  const env: Record<string, string> = {};
  entries.forEach((kv, i) => {
    const eq = kv.indexOf('=');
    if (eq > 0) env[kv.slice(0, eq)] = kv.slice(eq + 1);
    else ctx.addIssue({ code: 'custom', path: [i], message: 'an Env entry is NAME=value' });
  });
  const parsed = CreateEnv.safeParse(env);
  for (const issue of parsed.error?.issues ?? []) {
    const name = issue.path[0];
    const at = typeof name === 'string' ? entries.map((kv) => kv.startsWith(`${name}=`)).lastIndexOf(true) : -1;
    const message = issue.code === 'invalid_key' ? (issue.issues[0]?.message ?? issue.message) : issue.message;
    ctx.addIssue({ code: 'custom', path: at >= 0 ? [at] : [], message });
  }
});

/**
 * The parts of an image's config a sandbox uses (names as in the OCI image config), bounded
 * by the pieces of a create (env, workdir, user) and of an exec (argv) they stand for: a
 * pull stores only what this accepts, and every reader parses with it.
 */
export const ImageConfig = z.object({
  Env: ImageEnv.default([]),
  WorkingDir: CreateSandboxRequest.shape.workdir.unwrap().optional(),
  User: CreateSandboxRequest.shape.user.unwrap().optional(),
  Entrypoint: ExecRequest.shape.argv.unwrap().optional(),
  Cmd: ExecRequest.shape.argv.unwrap().optional(),
});
export type ImageConfig = z.infer<typeof ImageConfig>;

export const ImageLayer = z.object({
  /** The EROFS layer it became (a layer of the layer API). */
  digest: LayerDigest,
  /** sha256 of the uncompressed layer tar (the config's rootfs.diff_ids entry). */
  diffId: LayerDigest,
  /** Size of the EROFS image. */
  sizeBytes: z.number().int().min(0),
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
  sizeBytes: z.number().int().min(0),
  createdAt: z.string(),
  /** Every layer is in the cloud pool's pre-synced set (creates from it may burst). */
  synced: z.boolean().optional(),
  /** Published cluster-wide by an operator (every tenant sees it under this name unless it has one of its own); otherwise the tenant's own. */
  published: z.boolean().optional(),
  /** Pulled from this registry reference (canonical: `docker.io/library/python:3.12`, or with `@sha256:...`); absent for an import. */
  ref: z.string().optional(),
});
export type Image = z.infer<typeof Image>;

/** `ready`: creates may use it; `pulling`: its first pull runs; `failed`: its only pull failed (`error` says why). */
export const ImageState = z.enum(['pulling', 'ready', 'failed']);
export type ImageState = z.infer<typeof ImageState>;

export const PullImageRequest = z.strictObject({
  ref: ImageRef,
  /** The image's name. Default: derived from the ref (see docs/images.md: `python:3.12` -> `python-3.12`). */
  name: ImageName.optional(),
  /** From a multi-platform index (default `linux/amd64`). */
  platform: Platform.default('linux/amd64'),
});
export type PullImageRequest = z.infer<typeof PullImageRequest>;

/** How far a pull is: layers and compressed blob bytes, of the manifest's totals (0 until the manifest is read). */
export const PullProgress = z.object({
  layersTotal: z.number().int(),
  layersDone: z.number().int(),
  /** Layers held already (same blob digest or diff_id): not fetched. */
  layersReused: z.number().int(),
  bytesTotal: z.number().int(),
  /** Blob bytes of the layers done or being fetched (a reused layer counts whole). */
  bytesDone: z.number().int(),
  /** Blob bytes read from the registry. */
  bytesFetched: z.number().int(),
});
export type PullProgress = z.infer<typeof PullProgress>;

/** The latest pull of an image name (kept beside the image record; one at a time per name, shared by every gateway). */
export const ImagePull = z.object({
  id: z.string(),
  ref: z.string(),
  platform: Platform,
  state: ImageState,
  startedAt: z.string(),
  finishedAt: z.string().optional(),
  /** The manifest, once resolved. */
  digest: LayerDigest.optional(),
  progress: PullProgress,
  error: ErrorBody.shape.error.optional(),
  /** Times another gateway took the pull over after the one running it stopped. */
  resumed: z.number().int().default(0),
});
export type ImagePull = z.infer<typeof ImagePull>;

/**
 * An image as the API answers it: the image (when one is ready; during its first pull
 * `layers` is empty and `digest` unset), its `state`, and its latest pull. A pull of a
 * name that holds a ready image leaves it `ready` (creates go on using it) until the new
 * one replaces it; `pull` shows that pull, `pull.error` why it failed.
 */
export const ImageRecord = Image.extend({
  digest: LayerDigest.optional(),
  state: ImageState,
  pull: ImagePull.optional(),
  /** `failed`: why (the pull's error). */
  error: ErrorBody.shape.error.optional(),
  /** Its check (`POST /v1/images/:name/check`), when one ran on this content: `check.state` `validated` is what a batch with `requireValidated` needs. */
  check: ImageCheck.optional(),
});
export type ImageRecord = z.infer<typeof ImageRecord>;

/** What one import did: which layers it had to build and which it found stored already. */
export const ImportReport = z.object({
  layersBuilt: z.number().int(),
  layersReused: z.number().int(),
  /** Bytes of the archive read. */
  archiveBytes: z.number().int(),
  durationMs: z.number(),
});
export type ImportReport = z.infer<typeof ImportReport>;

export const ImportedImage = ImageRecord.extend({ import: ImportReport });
export type ImportedImage = z.infer<typeof ImportedImage>;

export const ImageList = z.object({ images: z.array(ImageRecord) });
export type ImageList = z.infer<typeof ImageList>;

/**
 * An imported image's config gives a sandbox its defaults: Env under the request's env,
 * WorkingDir unless the request names one, User unless the request names one. The record
 * keeps the result, so the worker (and a claimed pool sandbox) sees one spec; it is held to
 * the create's own schema, so the record parses when read (the image's env with the
 * request's may pass the create's bounds: `invalid_image`, coded at the gateway).
 */
export function withImageDefaults(request: CreateSandboxRequest, config: ImageConfig | undefined): CreateSandboxRequest {
  const imageEnv = Object.fromEntries((config?.Env ?? []).flatMap((kv) => {
    const eq = kv.indexOf('=');
    return eq > 0 ? [[kv.slice(0, eq), kv.slice(eq + 1)]] : [];
  }));
  const workdir = request.workdir ?? (config?.WorkingDir?.startsWith('/') ? config.WorkingDir : undefined) ?? '/';
  const user = request.user ?? (config?.User || undefined);
  const resolved = { ...request, env: { ...imageEnv, ...request.env }, workdir, ...(user ? { user } : {}) };
  const checked = CreateSandboxRequest.safeParse(resolved);
  if (!checked.success) throw new RollboxError('invalid_image', `the image's config gives the sandbox ${issuesText(checked.error)}`);
  return resolved;
}

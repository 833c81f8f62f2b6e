import { createHash } from 'node:crypto';
import { z } from 'zod';
import { ImageConfig, Platform, RollboxError, issuesText } from '../api/index.ts';

/**
 * Which image of an archive to import, and what it is made of: an OCI layout's index.json
 * (with nested indexes of multi-platform images), or a `docker save` manifest.json (older
 * Docker: `<id>/layer.tar` paths; Docker 25+: both files, naming `blobs/sha256/...`).
 */

const Digest = z.string().regex(/^sha256:[0-9a-f]{64}$/, 'only sha256 digests are supported');
/** An index's platforms are quoted in errors (no manifest for the platform asked): bounded. */
const PlatformSpec = z.object({ os: z.string().max(64), architecture: z.string().max(64), variant: z.string().max(64).optional() });
const Descriptor = z.object({
  mediaType: z.string().max(256).optional(),
  digest: Digest,
  /** Summed into a pull's progress (which must stay a safe integer) and compared with what a registry sends: whole bytes, at most 16 TiB. */
  size: z.number().int().min(0).max(2 ** 44).optional(),
  platform: PlatformSpec.optional(),
  annotations: z.record(z.string(), z.string()).optional(),
});
export type Descriptor = z.infer<typeof Descriptor>;
const OciIndex = z.object({ manifests: z.array(Descriptor) });
const OciManifest = z.object({ config: Descriptor, layers: z.array(Descriptor) });
const DockerManifest = z.array(z.object({ Config: z.string(), RepoTags: z.array(z.string()).nullish(), Layers: z.array(z.string()) }));
const ImageConfigBlob = z.object({
  os: z.string().optional(),
  architecture: z.string().optional(),
  variant: z.string().optional(),
  config: z
    .object({
      Env: z.array(z.string()).nullish(),
      WorkingDir: z.string().nullish(),
      User: z.string().nullish(),
      Entrypoint: z.array(z.string()).nullish(),
      Cmd: z.array(z.string()).nullish(),
    })
    .nullish(),
  rootfs: z.object({ diff_ids: z.array(Digest) }),
});

const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);
const REF_ANNOTATIONS = ['io.containerd.image.name', 'org.opencontainers.image.ref.name'];

export interface ChosenImage {
  digest: string;
  platform: string;
  /** Archive paths of the layer blobs, lowest first. */
  layerPaths: string[];
  /** The config's diff_ids, one per layer. */
  diffIds: string[];
  config: ImageConfig;
}

function invalid(message: string): never {
  throw new RollboxError('invalid_image', message);
}

export function blobPath(digest: string): string {
  return `blobs/sha256/${digest.slice('sha256:'.length)}`;
}

export function sha256Of(buf: Buffer): string {
  return `sha256:${createHash('sha256').update(buf).digest('hex')}`;
}

function parseJson<T>(schema: z.ZodType<T>, buf: Buffer | undefined, what: string): T {
  if (!buf) invalid(`the archive has no ${what}`);
  let raw: unknown;
  try {
    raw = JSON.parse(buf.toString('utf8'));
  } catch {
    invalid(`${what} is not JSON`);
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) invalid(`${what}: ${issuesText(parsed.error)}`);
  return parsed.data;
}

/** A blob the archive holds, checked against its digest. */
function blob(metadata: ReadonlyMap<string, Buffer>, digest: string, what: string): Buffer {
  const buf = metadata.get(blobPath(digest));
  if (!buf) invalid(`${what} ${digest} is not in the archive`);
  if (sha256Of(buf) !== digest) invalid(`${what} ${digest}: its bytes hash to ${sha256Of(buf)}`);
  return buf;
}

const platformOf = (p: { os?: string; architecture?: string; variant?: string | undefined }): string => [p.os ?? 'unknown', p.architecture ?? 'unknown', ...(p.variant ? [p.variant] : [])].join('/');

/** linux/arm64 matches linux/arm64/v8 and the other way round; an asked variant must match. */
function platformMatches(have: string, want: string): boolean {
  const [hOs, hArch, hVar] = have.split('/');
  const [wOs, wArch, wVar] = want.split('/');
  return hOs === wOs && hArch === wArch && (!wVar || !hVar || hVar === wVar);
}

/** Docker Hub's implied prefixes dropped: `docker.io/library/app:1` is `app:1`. */
const shortRef = (ref: string): string => ref.replace(/^docker\.io\/(library\/)?/, '');

/** A ref asked (`app:1`, or `app` for any tag) against one an archive names. */
function refMatches(have: string | undefined, want: string): boolean {
  if (have === undefined) return false;
  const [h, w] = [shortRef(have), shortRef(want)];
  return h === w || (!/:[^/]+$/.test(w) && h.replace(/:[^/]+$/, '') === w);
}

function onlyOne<T>(candidates: T[], label: (c: T) => string, what: string): T {
  if (candidates.length === 1) return candidates[0]!;
  if (candidates.length === 0) invalid(`no image ${what}`);
  invalid(`the archive holds ${candidates.length} images (${candidates.map(label).join(', ').slice(0, 300)}): choose one with ref=`);
}

/** The config blob's parts a sandbox uses, its diff_ids (one per layer) and its platform. */
export function imageConfigOf(buf: Buffer, layerCount: number): { config: ImageConfig; diffIds: string[]; platform: string } {
  const blobConfig = parseJson(ImageConfigBlob, buf, 'image config');
  if (blobConfig.rootfs.diff_ids.length !== layerCount) invalid(`the image config lists ${blobConfig.rootfs.diff_ids.length} layer diff_ids, its manifest ${layerCount} layers`);
  const c = blobConfig.config ?? {};
  // What the record keeps is what every reader parses it with (ImageConfig): checked here, before anything is fetched or stored.
  const config = ImageConfig.safeParse({
    Env: c.Env ?? [],
    // A relative WorkingDir was never used (a sandbox's workdir is absolute): not kept.
    ...(c.WorkingDir?.startsWith('/') ? { WorkingDir: c.WorkingDir } : {}),
    ...(c.User ? { User: c.User } : {}),
    ...(c.Entrypoint?.length ? { Entrypoint: c.Entrypoint } : {}),
    ...(c.Cmd?.length ? { Cmd: c.Cmd } : {}),
  });
  if (!config.success) invalid(`image config: ${issuesText(config.error, ['config'])}`);
  const platform = platformOf(blobConfig);
  if (!Platform.safeParse(platform).success) {
    invalid(`image config: its platform (os, architecture, variant) ${platform.length <= 64 ? JSON.stringify(platform) : `of ${platform.length} characters`} is not os/architecture[/variant] in lowercase letters and digits`);
  }
  return { config: config.data, diffIds: blobConfig.rootfs.diff_ids, platform };
}

export function chooseImage(metadata: ReadonlyMap<string, Buffer>, want: { platform: string; ref?: string | undefined }): ChosenImage {
  if (metadata.has('index.json')) return chooseFromOciIndex(metadata, want);
  if (metadata.has('manifest.json')) return chooseFromDockerManifest(metadata, want);
  invalid('neither index.json (an OCI image layout) nor manifest.json (docker save) is in the archive');
}

function chooseFromOciIndex(metadata: ReadonlyMap<string, Buffer>, want: { platform: string; ref?: string | undefined }): ChosenImage {
  const index = parseJson(OciIndex, metadata.get('index.json'), 'index.json');
  const refOf = (d: Descriptor): string | undefined => REF_ANNOTATIONS.map((a) => d.annotations?.[a]).find((r) => r !== undefined);
  let tops = index.manifests;
  if (want.ref !== undefined) {
    tops = tops.filter((d) => refMatches(refOf(d), want.ref!));
    if (tops.length === 0) invalid(`no image in the archive is named ${want.ref} (it has: ${index.manifests.map((d) => refOf(d) ?? d.digest).join(', ').slice(0, 300)})`);
  }
  // One image per top-level entry (a nested index is one multi-platform image).
  const top = onlyOne(tops, (d) => refOf(d) ?? d.digest, 'in index.json');
  const nested = INDEX_TYPES.has(top.mediaType ?? '');
  const manifest = nested ? manifestForPlatform(blob(metadata, top.digest, 'image index'), `image index ${top.digest}`, want.platform) : top;
  const parsed = parseImageManifest(blob(metadata, manifest.digest, 'manifest'), `manifest ${manifest.digest}`);
  const { config, diffIds, platform } = imageConfigOf(blob(metadata, parsed.config.digest, 'image config'), parsed.layers.length);
  checkPlatform(platform, want.platform);
  return { digest: manifest.digest, platform, layerPaths: parsed.layers.map((l) => blobPath(l.digest)), diffIds, config };
}

/** The manifest an image index (OCI index or Docker manifest list) gives for a platform. */
export function manifestForPlatform(indexBytes: Buffer, what: string, want: string): Descriptor {
  const index = parseJson(OciIndex, indexBytes, what);
  const forPlatform = index.manifests.filter((d) => d.platform && platformMatches(platformOf(d.platform), want));
  if (forPlatform.length === 0) {
    invalid(`no manifest for platform ${want} (the image has: ${index.manifests.map((d) => (d.platform ? platformOf(d.platform) : 'unknown')).join(', ').slice(0, 300)}); choose one with platform=`);
  }
  return forPlatform[0]!;
}

/** An image manifest (OCI or Docker schema 2): its config and layer descriptors. */
export function parseImageManifest(bytes: Buffer, what: string): { config: Descriptor; layers: Descriptor[] } {
  return parseJson(OciManifest, bytes, what);
}

/** A single-platform image must be for the platform asked (an image that names none passes). */
export function checkPlatform(platform: string, want: string): void {
  if (!platformMatches(platform, want) && platform !== 'unknown/unknown') invalid(`the image is for ${platform}, not ${want}; choose with platform=`);
}

function chooseFromDockerManifest(metadata: ReadonlyMap<string, Buffer>, want: { platform: string; ref?: string | undefined }): ChosenImage {
  let entries = parseJson(DockerManifest, metadata.get('manifest.json'), 'manifest.json');
  if (want.ref !== undefined) {
    entries = entries.filter((e) => (e.RepoTags ?? []).some((t) => refMatches(t, want.ref!)));
    if (entries.length === 0) invalid(`no image in the archive is tagged ${want.ref}`);
  }
  const entry = onlyOne(entries, (e) => e.RepoTags?.[0] ?? e.Config, 'in manifest.json');
  const configPath = entry.Config.replace(/^\.\//, '');
  const configBuf = metadata.get(configPath);
  if (!configBuf) invalid(`manifest.json names config ${entry.Config}, which is not in the archive`);
  // Docker's image ID is its config's digest; named by it, the config is checked against it.
  const configDigest = sha256Of(configBuf);
  const named = /^(?:blobs\/sha256\/)?([0-9a-f]{64})(?:\.json)?$/.exec(configPath)?.[1];
  if (named && `sha256:${named}` !== configDigest) invalid(`config ${entry.Config}: its bytes hash to ${configDigest}`);
  const { config, diffIds, platform } = imageConfigOf(configBuf, entry.Layers.length);
  if (!platformMatches(platform, want.platform)) invalid(`the image is for ${platform}, not ${want.platform}`);
  return { digest: configDigest, platform, layerPaths: entry.Layers.map((p) => p.replace(/^\.\//, '')), diffIds, config };
}

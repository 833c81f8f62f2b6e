/**
 * Image archives for tests, built in memory with no external tool: layer tars, OCI image
 * layouts (one image, several images, a multi-platform index) and `docker save` archives
 * (Docker < 25's legacy layout and Docker 25+'s OCI one), each optionally corrupted the
 * ways a real upload can be (a blob missing, a blob whose bytes do not hash to its name,
 * a cut-off stream). Everything is deterministic: the same definition gives the same bytes.
 */
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { gzipSync } from 'node:zlib';
import { pack, type Header } from 'tar-stream';

type TarHeader = Partial<Header> & Pick<Header, 'name'>;

/** One entry of a layer tar. Unset fields: a file, mode 0644 (directories 0755, symlinks 0777), owner 0:0, mtime 0. */
export interface TarEntry {
  name: string;
  type?: 'file' | 'directory' | 'symlink' | 'link' | 'fifo' | 'character-device' | 'block-device';
  content?: string | Buffer;
  /** tar-stream replaces a mode of 0 by the default one (0644, directories 0755). */
  mode?: number;
  uid?: number;
  gid?: number;
  /** Target of a symlink, or the path a hard link (`link`) points to. */
  linkname?: string;
  devmajor?: number;
  devminor?: number;
  /** PAX records written before the entry, e.g. `{ 'SCHILY.xattr.user.note': 'hi' }` for an xattr. */
  pax?: Record<string, string>;
  mtime?: Date;
}

/** The image config fields a sandbox uses (OCI image config names). */
export interface ImageConfigDef {
  Env?: string[];
  WorkingDir?: string;
  User?: string;
  Entrypoint?: string[];
  Cmd?: string[];
}

/** One image: its layers as uncompressed tars (lowest first), its config, its platform (default linux/amd64). */
export interface ImageDef {
  layers: Buffer[];
  config?: ImageConfigDef;
  os?: string;
  architecture?: string;
  variant?: string;
}

/**
 * Damage done to an archive. `missing-blob`: one layer blob is left out. `digest-mismatch`:
 * one layer blob's bytes change after its digest was taken (its path, the manifest and the
 * config's diff_ids keep the old digests); in a gzip blob the byte flipped is the gzip
 * header's MTIME, so the blob still decompresses to the very same tar and only a check of
 * the blob digest catches it; in an uncompressed tar it is the first byte of file data (a
 * tar without file data gets a header byte changed, checksum fixed). `truncate`: the final
 * archive is cut to `bytes` bytes. `layer` picks which layer of the first image (default 0,
 * the lowest).
 */
export type Corruption = ({ kind: 'missing-blob' } | { kind: 'digest-mismatch' } | { kind: 'truncate'; bytes: number }) & { layer?: number };

export const MEDIA_TYPES = {
  index: 'application/vnd.oci.image.index.v1+json',
  manifest: 'application/vnd.oci.image.manifest.v1+json',
  config: 'application/vnd.oci.image.config.v1+json',
  layer: 'application/vnd.oci.image.layer.v1.tar',
  layerGzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
  layerZstd: 'application/vnd.oci.image.layer.v1.tar+zstd',
} as const;

export const REF_NAME_ANNOTATION = 'org.opencontainers.image.ref.name';

/** An OCI content descriptor. */
export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  platform?: { os: string; architecture: string; variant?: string };
  annotations?: Record<string, string>;
}

/** Hex sha256 of the bytes (no `sha256:` prefix). */
export function sha256Hex(buf: Buffer | string): string {
  return createHash('sha256').update(buf).digest('hex');
}

/** `sha256:<hex>` of the bytes. */
export function digestOf(buf: Buffer | string): string {
  return `sha256:${sha256Hex(buf)}`;
}

/** `blobs/sha256/<hex>` for a `sha256:<hex>` digest. */
export function blobPath(digest: string): string {
  return `blobs/sha256/${digest.replace(/^sha256:/, '')}`;
}

/** `os/architecture[/variant]` of an image definition (defaults linux/amd64). */
export function platformOf(image: Pick<ImageDef, 'os' | 'architecture' | 'variant'>): string {
  return [image.os ?? 'linux', image.architecture ?? 'amd64', ...(image.variant ? [image.variant] : [])].join('/');
}

/** An uncompressed tar of the entries, in order; deterministic (mtime 0 unless an entry sets one). */
export async function layerTar(entries: TarEntry[]): Promise<Buffer> {
  return tarBuffer(
    entries.map(({ content, pax, mtime, ...rest }) => ({
      // tar-stream 3 writes a PAX header (path, linkpath and these records) whenever `pax` is set.
      header: { ...(rest.type === 'symlink' ? { mode: 0o777 } : {}), ...rest, mtime: mtime ?? EPOCH, ...(pax && Object.keys(pax).length > 0 ? { pax } : {}) },
      content: content ?? '',
    })),
  );
}

/** The JSON blobs of one image: config (diff_ids = sha256 of the uncompressed layers) and manifest. */
export function imageJsonBlobs(image: ImageDef, layers: readonly Descriptor[], diffIds: readonly string[]): { config: Buffer; manifest: Buffer; configDescriptor: Descriptor } {
  const c = image.config ?? {};
  const config = Buffer.from(
    JSON.stringify({
      architecture: image.architecture ?? 'amd64',
      os: image.os ?? 'linux',
      ...(image.variant ? { variant: image.variant } : {}),
      config: { Env: c.Env ?? [], WorkingDir: c.WorkingDir ?? '', User: c.User ?? '', Entrypoint: c.Entrypoint ?? null, Cmd: c.Cmd ?? null },
      rootfs: { type: 'layers', diff_ids: diffIds },
    }),
  );
  const configDescriptor: Descriptor = { mediaType: MEDIA_TYPES.config, digest: digestOf(config), size: config.length };
  const manifest = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: MEDIA_TYPES.manifest, config: configDescriptor, layers }));
  return { config, manifest, configDescriptor };
}

/** What an image becomes in an OCI layout: its blobs and the digests a test checks an import against. */
export interface OciImage {
  platform: string;
  /** One per layer, lowest first (the same blob twice when the image repeats a layer). */
  layers: { descriptor: Descriptor; diffId: string; blob: Buffer }[];
  config: { descriptor: Descriptor; blob: Buffer };
  manifest: { descriptor: Descriptor; blob: Buffer };
}

/** How a layer blob is compressed: `true` is gzip; a list gives each layer its own (lowest first). */
export type Compression = boolean | 'zstd' | (boolean | 'zstd')[];

/** The blobs and digests of one image (layers gzip-compressed when `gzip`, zstd with `'zstd'`: the `zstd` tool). */
export function ociImage(image: ImageDef, opts: { gzip?: Compression } = {}): OciImage {
  const layers = image.layers.map((tar, i) => {
    const how = Array.isArray(opts.gzip) ? (opts.gzip[i] ?? false) : (opts.gzip ?? false);
    const blob = how === 'zstd' ? execFileSync('zstd', ['-q', '-c'], { input: tar }) : how ? gzipSync(tar) : tar;
    const descriptor: Descriptor = { mediaType: how === 'zstd' ? MEDIA_TYPES.layerZstd : how ? MEDIA_TYPES.layerGzip : MEDIA_TYPES.layer, digest: digestOf(blob), size: blob.length };
    return { descriptor, diffId: digestOf(tar), blob };
  });
  const { config, manifest, configDescriptor } = imageJsonBlobs(
    image,
    layers.map((l) => l.descriptor),
    layers.map((l) => l.diffId),
  );
  return {
    platform: platformOf(image),
    layers,
    config: { descriptor: configDescriptor, blob: config },
    manifest: { descriptor: { mediaType: MEDIA_TYPES.manifest, digest: digestOf(manifest), size: manifest.length }, blob: manifest },
  };
}

/**
 * An OCI image layout as one tar: the blobs first (per image its layers, config, manifest;
 * each blob once), then `index.json` and `oci-layout`. `index: 'flat'` (default) lists each
 * image's manifest in index.json (annotated `org.opencontainers.image.ref.name` = refNames[i]
 * when given): one image, or several images in one archive. `index: 'nested'` makes the
 * images one multi-platform image: index.json names one image index blob whose manifests
 * carry their platform (refNames[0] annotates that index).
 */
export async function ociLayout(images: ImageDef[], opts: { gzip?: Compression; index?: 'flat' | 'nested'; refNames?: string[]; corrupt?: Corruption } = {}): Promise<Buffer> {
  if (images.length === 0) throw new Error('ociLayout: no image');
  const built = images.map((image) => ociImage(image, { gzip: opts.gzip ?? false }));
  const blobs = new BlobSet();
  for (const image of built) {
    for (const l of image.layers) blobs.add(l.descriptor.digest, l.blob);
    blobs.add(image.config.descriptor.digest, image.config.blob);
    blobs.add(image.manifest.descriptor.digest, image.manifest.blob);
  }
  const refAnnotation = (i: number) => (opts.refNames?.[i] !== undefined ? { annotations: { [REF_NAME_ANNOTATION]: opts.refNames[i] } } : {});
  let manifests: Descriptor[];
  if (opts.index === 'nested') {
    const nested = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: MEDIA_TYPES.index,
        manifests: built.map((image, i) => ({ ...image.manifest.descriptor, platform: platformSpec(images[i]!) })),
      }),
    );
    blobs.add(digestOf(nested), nested);
    manifests = [{ mediaType: MEDIA_TYPES.index, digest: digestOf(nested), size: nested.length, ...refAnnotation(0) }];
  } else {
    manifests = built.map((image, i) => ({ ...image.manifest.descriptor, ...refAnnotation(i) }));
  }
  const target = corruptionTarget(built[0]!, opts.corrupt);
  const files: ArchiveFile[] = [{ name: 'blobs/', type: 'directory' }, { name: 'blobs/sha256/', type: 'directory' }, ...blobs.files(target)];
  files.push({ name: 'index.json', content: indexJson(manifests) });
  files.push({ name: 'oci-layout', content: OCI_LAYOUT });
  return truncate(await archive(files), opts.corrupt);
}

/**
 * A `docker save` archive of one image. `legacy` (default, Docker < 25): per layer a
 * `<v1 id>/` directory with `VERSION`, `json` and an uncompressed `layer.tar` (a layer the
 * image repeats is stored once: the later `layer.tar` is a symlink to the first, as Docker
 * does), then `<config hex>.json`, `manifest.json` and `repositories`. `oci` (Docker 25+):
 * an OCI layout (uncompressed layers) plus a `manifest.json` naming `blobs/sha256/...`
 * paths, and `repositories`. `tag` (default `rollbox-test:latest`; null: untagged, as
 * `docker save <id>` writes) goes in RepoTags, `repositories` and the index annotations.
 */
export async function dockerSave(image: ImageDef, opts: { tag?: string | null; format?: 'legacy' | 'oci'; corrupt?: Corruption } = {}): Promise<Buffer> {
  const tag = opts.tag === undefined ? 'rollbox-test:latest' : opts.tag;
  const oci = ociImage(image);
  const files: ArchiveFile[] = [];
  const target = corruptionTarget(oci, opts.corrupt);
  let configPath: string;
  let layerPaths: string[];
  if (opts.format === 'oci') {
    const blobs = new BlobSet();
    for (const l of oci.layers) blobs.add(l.descriptor.digest, l.blob);
    blobs.add(oci.config.descriptor.digest, oci.config.blob);
    blobs.add(oci.manifest.descriptor.digest, oci.manifest.blob);
    files.push({ name: 'blobs/', type: 'directory' }, { name: 'blobs/sha256/', type: 'directory' }, ...blobs.files(target));
    const annotations = tag === null ? {} : { annotations: { 'io.containerd.image.name': qualifiedName(tag), [REF_NAME_ANNOTATION]: tag.slice(tag.lastIndexOf(':') + 1) } };
    files.push({ name: 'index.json', content: indexJson([{ ...oci.manifest.descriptor, ...annotations }]) });
    configPath = blobPath(oci.config.descriptor.digest);
    layerPaths = oci.layers.map((l) => blobPath(l.descriptor.digest));
  } else {
    // v1 IDs: one per position in the layer chain (as Docker derives them), so a repeated
    // layer gets its own directory; its layer.tar links to the first copy.
    const stored = new Map<string, string>();
    let parent = '';
    layerPaths = [];
    oci.layers.forEach((l, i) => {
      const id = sha256Hex(`${parent}\n${l.diffId}\n${i}`);
      const json = JSON.stringify({ id, ...(parent ? { parent } : {}), created: '1970-01-01T00:00:00Z', container_config: { Cmd: null }, os: image.os ?? 'linux' });
      files.push({ name: `${id}/`, type: 'directory' }, { name: `${id}/VERSION`, content: Buffer.from('1.0') }, { name: `${id}/json`, content: Buffer.from(json) });
      const first = stored.get(l.diffId);
      if (first) files.push({ name: `${id}/layer.tar`, type: 'symlink', linkname: `../${first}` });
      else if (!(target?.digest === l.descriptor.digest && target.kind === 'missing-blob')) {
        files.push({ name: `${id}/layer.tar`, content: target?.digest === l.descriptor.digest && target.kind === 'digest-mismatch' ? flipByte(l.blob) : l.blob });
      }
      if (!first) stored.set(l.diffId, `${id}/layer.tar`);
      layerPaths.push(`${id}/layer.tar`);
      parent = id;
    });
    configPath = `${oci.config.descriptor.digest.replace(/^sha256:/, '')}.json`;
    files.push({ name: configPath, content: oci.config.blob });
  }
  files.push({ name: 'manifest.json', content: Buffer.from(JSON.stringify([{ Config: configPath, RepoTags: tag === null ? null : [tag], Layers: layerPaths }])) });
  if (opts.format === 'oci') files.push({ name: 'oci-layout', content: OCI_LAYOUT });
  if (tag !== null) {
    const colon = tag.lastIndexOf(':');
    const [repo, version] = colon > tag.lastIndexOf('/') ? [tag.slice(0, colon), tag.slice(colon + 1)] : [tag, 'latest'];
    // Legacy `repositories` names the top layer's v1 ID; Docker 25 names the manifest's hex.
    const top = opts.format === 'oci' ? oci.manifest.descriptor.digest.replace(/^sha256:/, '') : layerPaths.at(-1)?.split('/')[0] ?? '';
    files.push({ name: 'repositories', content: Buffer.from(JSON.stringify({ [repo]: { [version]: top } })) });
  }
  return truncate(await archive(files), opts.corrupt);
}

// ---------------------------------------------------------------------------------------

const EPOCH = new Date(0);
const OCI_LAYOUT = Buffer.from(JSON.stringify({ imageLayoutVersion: '1.0.0' }));

interface ArchiveFile {
  name: string;
  type?: 'file' | 'directory' | 'symlink';
  content?: Buffer;
  linkname?: string;
}

/** Blobs of an OCI layout, each once, in the order first added. */
class BlobSet {
  private readonly blobs = new Map<string, Buffer>();
  add(digest: string, blob: Buffer): void {
    if (!this.blobs.has(digest)) this.blobs.set(digest, blob);
  }
  /** The blob files, with a corruption applied to its target blob. */
  files(target: { digest: string; kind: 'missing-blob' | 'digest-mismatch' } | undefined): ArchiveFile[] {
    const files: ArchiveFile[] = [];
    for (const [digest, blob] of this.blobs) {
      if (target?.digest === digest && target.kind === 'missing-blob') continue;
      files.push({ name: blobPath(digest), content: target?.digest === digest && target.kind === 'digest-mismatch' ? flipByte(blob) : blob });
    }
    return files;
  }
}

function corruptionTarget(image: OciImage, corrupt: Corruption | undefined): { digest: string; kind: 'missing-blob' | 'digest-mismatch' } | undefined {
  if (!corrupt || corrupt.kind === 'truncate') return undefined;
  const layer = image.layers[corrupt.layer ?? 0];
  if (!layer) throw new Error(`corrupt: the image has no layer ${corrupt.layer ?? 0}`);
  return { digest: layer.descriptor.digest, kind: corrupt.kind };
}

function truncate(buf: Buffer, corrupt: Corruption | undefined): Buffer {
  return corrupt?.kind === 'truncate' ? buf.subarray(0, Math.max(0, Math.min(corrupt.bytes, buf.length))) : buf;
}

/** A copy of a layer blob with one byte changed that keeps it readable (see Corruption). */
function flipByte(blob: Buffer): Buffer {
  const copy = Buffer.from(blob);
  if (copy[0] === 0x1f && copy[1] === 0x8b) {
    copy[4] = copy[4]! ^ 0xff; // gzip MTIME: same decompressed bytes, another blob digest
    return copy;
  }
  // A tar: the first byte of file data, else a header's mtime (with its checksum fixed).
  for (let offset = 0; offset + 512 <= copy.length; ) {
    const header = copy.subarray(offset, offset + 512);
    if (header.every((b) => b === 0)) break;
    const size = parseInt(header.subarray(124, 136).toString('latin1').replace(/\0.*$/s, '').trim() || '0', 8);
    if (size > 0 && String.fromCharCode(header[156]!) !== 'x' && String.fromCharCode(header[156]!) !== 'g') {
      copy[offset + 512] = copy[offset + 512]! ^ 0x01;
      return copy;
    }
    offset += 512 + Math.ceil(size / 512) * 512;
  }
  if (copy.length < 512 || copy.subarray(0, 512).every((b) => b === 0)) throw new Error('corrupt: the layer tar has no entry to change');
  copy[136 + 10] = copy[136 + 10] === 0x30 ? 0x31 : 0x30; // last digit of the octal mtime
  copy.fill(0x20, 148, 156);
  let sum = 0;
  for (let i = 0; i < 512; i++) sum += copy[i]!;
  copy.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'latin1');
  return copy;
}

function platformSpec(image: ImageDef): { os: string; architecture: string; variant?: string } {
  return { os: image.os ?? 'linux', architecture: image.architecture ?? 'amd64', ...(image.variant ? { variant: image.variant } : {}) };
}

function indexJson(manifests: Descriptor[]): Buffer {
  return Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: MEDIA_TYPES.index, manifests }));
}

/** Docker's fully qualified reference (`busybox:1` -> `docker.io/library/busybox:1`). */
function qualifiedName(tag: string): string {
  const first = tag.split('/')[0]!;
  if (!tag.includes('/')) return `docker.io/library/${tag}`;
  if (first.includes('.') || first.includes(':') || first === 'localhost') return tag;
  return `docker.io/${tag}`;
}

async function archive(files: ArchiveFile[]): Promise<Buffer> {
  return tarBuffer(
    files.map((f) => ({
      header: { name: f.name, type: f.type ?? 'file', mode: f.type === 'directory' ? 0o755 : f.type === 'symlink' ? 0o777 : 0o644, mtime: EPOCH, ...(f.linkname ? { linkname: f.linkname } : {}) },
      content: f.content ?? '',
    })),
  );
}

async function tarBuffer(entries: { header: TarHeader; content: string | Buffer }[]): Promise<Buffer> {
  const archive = pack();
  const chunks: Buffer[] = [];
  archive.on('data', (c: unknown) => void chunks.push(c as Buffer));
  const done = new Promise<void>((resolve, reject) => {
    archive.on('end', () => resolve());
    archive.on('error', reject);
  });
  for (const { header, content } of entries) {
    await new Promise<void>((resolve, reject) => archive.entry(header, content, (err) => (err ? reject(err) : resolve())));
  }
  archive.finalize();
  await done;
  return Buffer.concat(chunks);
}

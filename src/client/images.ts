import { ImageList, ImageRecord, ImportedImage, type PullImageRequest } from '../api/index.ts';
import { json, streamOf } from './body.ts';
import type { RollboxClient } from './client.ts';
import { RollboxApiError } from './errors.ts';

/** The options of an import (sent as query parameters); unset ones take the API's defaults. */
export interface ImportImageOptions {
  /** The image's name: what a create's `image.base` takes. */
  name: string;
  /** From a multi-platform index: `os/architecture[/variant]` (default `linux/amd64`). */
  platform?: string;
  /** Which image of an archive holding several: a tag (`repo:tag`, or an OCI `org.opencontainers.image.ref.name`). */
  ref?: string;
}

/** What to pull: `ref` as docker takes it; `name` (default: derived from the ref) and `platform` (default linux/amd64). */
export type PullImageOptions = { ref: string; name?: string; platform?: string };

export interface WaitForImageOptions {
  /** Give up (throw `image_pull_timeout`) after this long; default: wait as long as it takes. */
  timeoutMs?: number;
  /** Between reads of the record (default 500 ms). */
  pollMs?: number;
  /** Each read of the record while the pull runs (progress: layers and bytes done of total). */
  onProgress?: (record: ImageRecord) => void;
}

/**
 * Images (import and delete: scope layer:write; reads: layer:read, sandbox:create or
 * layer:write) over a RollboxClient, with its retries. An import of the same archive under
 * the same name is idempotent (its layers are content-addressed, a stored one is not built
 * again), so an import from bytes in memory is retried when the gateway refused it (429,
 * 503); a stream can be sent only once. Reads and deletes are retried like every other call.
 */
export class ImagesClient {
  constructor(private readonly client: RollboxClient) {}

  /**
   * Imports a `docker save` archive or an OCI image layout (a tar): the body's bytes, in
   * chunks sent as they come (a file's read stream), never held whole. The gateway builds
   * each layer as its blob streams in and answers once the last one is stored, with what
   * the import built and what it found stored already. A malformed archive throws
   * `invalid_image` (or `invalid_layer` for a layer that cannot be unpacked); nothing of it stays.
   */
  async importImage(archive: ReadableStream<Uint8Array> | Uint8Array | AsyncIterable<Uint8Array>, options: ImportImageOptions): Promise<ImportedImage> {
    const params = new URLSearchParams({ name: options.name });
    if (options.platform !== undefined) params.set('platform', options.platform);
    if (options.ref !== undefined) params.set('ref', options.ref);
    const bytes = archive instanceof Uint8Array;
    const body = bytes || archive instanceof ReadableStream ? archive : streamOf(archive);
    const init = { headers: { 'content-type': 'application/x-tar' }, body: body as unknown as BodyInit, retry: bytes ? ('refused' as const) : ('never' as const) };
    return ImportedImage.parse(await this.client.request('POST', `/v1/images?${params}`, init, json));
  }

  /**
   * Starts pulling an image from its registry (scope layer:write) and answers its record at
   * once: `pulling` for a new image (`pull` shows how far), or `ready` with the new pull in
   * `pull` when the name holds an image already. A second pull of the same ref while one
   * runs joins it (the same `pull.id`). Retried safely: a retry joins the pull it started.
   */
  async pullImage(options: PullImageOptions): Promise<ImageRecord> {
    const body: PullImageRequest = { ref: options.ref, ...(options.name !== undefined ? { name: options.name } : {}), platform: options.platform ?? 'linux/amd64' };
    const init = { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) };
    return ImageRecord.parse(await this.client.request('POST', '/v1/images/pull', init, json));
  }

  /**
   * Reads the record until the pull `pullId` (default: the one running now) has ended:
   * answers the ready image, throws the pull's error (`RollboxApiError` with its code:
   * `registry_unauthorized`, `image_not_found`, ...) if it failed.
   */
  async waitForImage(name: string, options: WaitForImageOptions & { pullId?: string } = {}): Promise<ImageRecord> {
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    let pullId = options.pullId;
    for (;;) {
      const record = await this.getImage(name);
      pullId ??= record.pull?.id;
      const pull = record.pull?.id === pullId ? record.pull : undefined;
      if (!pull || pull.state !== 'pulling') {
        if (pull?.state === 'failed') throw new RollboxApiError(422, pull.error?.code ?? 'internal', pull.error?.message ?? 'the pull failed');
        if (record.state === 'ready') return record;
        throw new RollboxApiError(409, 'conflict', `image ${name}: its pull ${pullId ?? ''} is no longer its latest`);
      }
      options.onProgress?.(record);
      if (Date.now() >= deadline) throw new RollboxApiError(504, 'image_pull_timeout', `image ${name} is still being pulled after ${options.timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, options.pollMs ?? 500));
    }
  }

  /** `pullImage`, then `waitForImage` of that pull: the ready image, or the pull's error. */
  async pullImageAndWait(options: PullImageOptions & WaitForImageOptions): Promise<ImageRecord> {
    const started = await this.pullImage(options);
    return this.waitForImage(started.name, { ...options, pullId: started.pull?.id });
  }

  /** The images (shared by the cluster): imported, pulled, or being pulled; each with its layers (lowest first), state, latest pull and whether its layers are all pre-synced for burst. */
  async listImages(): Promise<ImageRecord[]> {
    return ImageList.parse(await this.client.request('GET', '/v1/images', {}, json)).images;
  }

  async getImage(name: string): Promise<ImageRecord> {
    return ImageRecord.parse(await this.client.request('GET', `/v1/images/${encodeURIComponent(name)}`, {}, json));
  }

  /**
   * Removes the record and answers it. Its layers stay while sandboxes, snapshots or other
   * images use them; garbage collection takes them after. Retried like any call, so a
   * retry after a dropped answer may find the image gone already (`not_found`).
   */
  async deleteImage(name: string): Promise<ImageRecord> {
    return ImageRecord.parse(await this.client.request('DELETE', `/v1/images/${encodeURIComponent(name)}`, {}, json));
  }
}

import { Image, ImageList, ImportedImage } from '../api/index.ts';
import { json, streamOf, type RollboxClient } from './client.ts';

/** The options of an import (sent as query parameters); unset ones take the API's defaults. */
export interface ImportImageOptions {
  /** The image's name: what a create's `image.base` takes. */
  name: string;
  /** From a multi-platform index: `os/architecture[/variant]` (default `linux/amd64`). */
  platform?: string;
  /** Which image of an archive holding several: a tag (`repo:tag`, or an OCI `org.opencontainers.image.ref.name`). */
  ref?: string;
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

  /** The imported images (shared by the cluster), each with its layers (lowest first) and whether they are all pre-synced for burst. */
  async listImages(): Promise<Image[]> {
    return ImageList.parse(await this.client.request('GET', '/v1/images', {}, json)).images;
  }

  async getImage(name: string): Promise<Image> {
    return Image.parse(await this.client.request('GET', `/v1/images/${encodeURIComponent(name)}`, {}, json));
  }

  /**
   * Removes the record and answers it. Its layers stay while sandboxes, snapshots or other
   * images use them; garbage collection takes them after. Retried like any call, so a
   * retry after a dropped answer may find the image gone already (`not_found`).
   */
  async deleteImage(name: string): Promise<Image> {
    return Image.parse(await this.client.request('DELETE', `/v1/images/${encodeURIComponent(name)}`, {}, json));
  }
}

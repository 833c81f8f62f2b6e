import tar from 'tar-stream';
import type { ContextEntry } from './context.ts';

/** A tar entry's header as tar-stream takes it (fields it fills in left out). */
export type TarHeader = Partial<tar.Header> & { name: string };

export function headerOf(entry: ContextEntry, target: string): TarHeader {
  return { name: target, type: entry.type, mode: entry.mode, mtime: entry.mtime, uid: 0, gid: 0, ...(entry.linkname !== undefined ? { linkname: entry.linkname } : {}) };
}

export async function untar(body: Buffer): Promise<{ header: TarHeader; data?: Buffer }[]> {
  const out: { header: TarHeader; data?: Buffer }[] = [];
  const extract = tar.extract();
  extract.end(body);
  for await (const entry of extract) {
    const chunks: Buffer[] = [];
    for await (const chunk of entry as AsyncIterable<Buffer>) chunks.push(chunk);
    out.push(entry.header.type === 'file' ? { header: entry.header, data: Buffer.concat(chunks) } : { header: entry.header });
  }
  return out;
}

/** Entries as one tar, in memory. */
export async function packTar(entries: readonly { header: TarHeader; data?: Buffer }[]): Promise<Buffer> {
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  pack.on('data', (c: unknown) => void chunks.push(c as Buffer));
  const ended = new Promise<void>((resolve, reject) => pack.on('end', resolve).on('error', reject));
  for (const { header, data } of entries) {
    if (header.type === 'file' || header.type === undefined) pack.entry({ ...header, size: data?.length ?? 0 }, data ?? Buffer.alloc(0));
    else pack.entry(header);
  }
  pack.finalize();
  await ended;
  return Buffer.concat(chunks);
}

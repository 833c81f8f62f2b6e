import { pack, type Header as TarHeader } from 'tar-stream';

export type TarEntry = Partial<TarHeader> & { name: string; content?: string | Buffer };

/** A tar of the given entries, in memory; `mtime` for every entry that names none (same bytes on every call). */
export async function tarOf(entries: TarEntry[], defaults: { mtime?: Date } = {}): Promise<Buffer> {
  const archive = pack();
  const chunks: Buffer[] = [];
  archive.on('data', (c: unknown) => void chunks.push(c as Buffer));
  const done = new Promise<void>((resolve) => archive.on('end', () => resolve()));
  for (const { content, ...header } of entries) archive.entry({ ...defaults, ...header }, content ?? '');
  archive.finalize();
  await done;
  return Buffer.concat(chunks);
}

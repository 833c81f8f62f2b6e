import { pack, type Header as TarHeader } from 'tar-stream';

export type TarEntry = Partial<TarHeader> & { name: string; content?: string };

/** A tar of the given entries, in memory. */
export async function tarOf(entries: TarEntry[]): Promise<Buffer> {
  const archive = pack();
  const chunks: Buffer[] = [];
  archive.on('data', (c: unknown) => void chunks.push(c as Buffer));
  const done = new Promise<void>((resolve) => archive.on('end', () => resolve()));
  for (const { content, ...header } of entries) archive.entry(header, content ?? '');
  archive.finalize();
  await done;
  return Buffer.concat(chunks);
}

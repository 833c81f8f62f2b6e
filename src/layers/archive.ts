import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { RollboxError } from '../api/index.ts';
import { entryComponents, symlinkStaysInside } from './layer-entry.ts';

/**
 * Checks a tar for the files API and writes it out again from the checked entries only,
 * so what the sandbox extracts is exactly what was checked (no second tar parser can
 * read the original differently). Refused with `invalid_archive`: absolute names, `..`,
 * relative symlinks that climb out of the target directory, entries written through a
 * symlink the archive itself created, hardlinks to anything but an earlier file of the
 * archive, device nodes and other special files. Absolute symlink targets are kept: like
 * every path of the files API they resolve in the sandbox's own root.
 *
 * The extraction itself runs inside the sandbox, so this is not what keeps the host
 * safe; it is what makes a tar mean the same thing everywhere.
 */
export async function checkFilesArchive(input: Buffer, limits: { maxEntries: number }): Promise<Buffer> {
  const extract = tar.extract();
  const out = tar.pack();
  const chunks: Buffer[] = [];
  out.on('data', (c: unknown) => void chunks.push(c as Buffer));
  const ended = new Promise<void>((resolve, reject) => {
    out.on('end', resolve);
    out.on('error', reject);
  });
  const source = Readable.from([input]);
  source.pipe(extract);
  const symlinks = new Set<string>();
  const files = new Set<string>();
  let entries = 0;
  try {
    for await (const entry of extract) {
      const h = entry.header;
      if (++entries > limits.maxEntries) throw new RollboxError('payload_too_large', `archive has more than ${limits.maxEntries} entries`);
      const comps = entryComponents(h.name);
      const rel = comps.join('/');
      for (let i = 1; i < comps.length; i++) {
        if (symlinks.has(comps.slice(0, i).join('/'))) throw new RollboxError('invalid_archive', `entry ${JSON.stringify(h.name)} is written through the archive's own symlink ${comps.slice(0, i).join('/')}`);
      }
      const header = { name: rel, mode: (h.mode ?? 0o644) & 0o7777, uid: h.uid ?? 0, gid: h.gid ?? 0, mtime: h.mtime ?? new Date(0) };
      const type = h.type ?? 'file';
      if (comps.length === 0) {
        if (type !== 'directory') throw new RollboxError('invalid_archive', `entry ${JSON.stringify(h.name)} names the target directory but is not a directory`);
        entry.resume();
        continue;
      }
      switch (type) {
        case 'directory':
          entry.resume();
          out.entry({ ...header, name: `${rel}/`, type: 'directory' });
          break;
        case 'file':
        case 'contiguous-file': {
          const parts: Buffer[] = [];
          for await (const chunk of entry as AsyncIterable<Buffer>) parts.push(chunk);
          files.add(rel);
          symlinks.delete(rel);
          out.entry({ ...header, type: 'file' }, Buffer.concat(parts));
          break;
        }
        case 'symlink': {
          const target = h.linkname ?? '';
          if (target === '' || target.includes('\0')) throw new RollboxError('invalid_archive', `symlink ${JSON.stringify(rel)} has an invalid target`);
          if (!symlinkStaysInside(comps, target)) throw new RollboxError('invalid_archive', `symlink ${JSON.stringify(rel)} -> ${JSON.stringify(target)} points outside the directory`);
          entry.resume();
          symlinks.add(rel);
          files.delete(rel);
          out.entry({ ...header, type: 'symlink', linkname: target });
          break;
        }
        case 'link': {
          const target = entryComponents(h.linkname ?? '', 'hardlink target').join('/');
          if (!files.has(target)) throw new RollboxError('invalid_archive', `hardlink ${JSON.stringify(rel)} -> ${JSON.stringify(h.linkname)} does not name an earlier file of the archive`);
          entry.resume();
          files.add(rel);
          out.entry({ ...header, type: 'link', linkname: target });
          break;
        }
        default:
          throw new RollboxError('invalid_archive', `entry ${JSON.stringify(rel)} has type ${String(type)}; only files, directories, symlinks and hardlinks are accepted`);
      }
    }
  } catch (err) {
    extract.destroy();
    out.destroy();
    if (err instanceof RollboxError) throw err.code === 'invalid_layer' ? new RollboxError('invalid_archive', err.message) : err;
    throw new RollboxError('invalid_archive', `malformed tar: ${err instanceof Error ? err.message : String(err)}`);
  }
  out.finalize();
  await ended;
  return Buffer.concat(chunks);
}

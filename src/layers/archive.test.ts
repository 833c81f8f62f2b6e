import { extract } from 'tar-stream';
import { describe, expect, it } from 'vitest';
import { tarOf, type TarEntry as Entry } from '../../test/support/tar.ts';
import { checkFilesArchive } from './archive.ts';

async function namesOf(tar: Buffer): Promise<string[]> {
  const ex = extract();
  const names: string[] = [];
  const done = (async () => {
    for await (const entry of ex) {
      names.push(`${entry.header.type}:${entry.header.name}${entry.header.linkname ? `->${entry.header.linkname}` : ''}`);
      entry.resume();
    }
  })();
  ex.end(tar);
  await done;
  return names;
}

const check = async (entries: Entry[]) => checkFilesArchive(await tarOf(entries), { maxEntries: 100 });

describe('checkFilesArchive', () => {
  it('rewrites accepted entries with normalized names', async () => {
    const out = await check([
      { name: './a/', type: 'directory' },
      { name: './a//b.txt', content: 'x' },
      { name: 'a/link', type: 'symlink', linkname: 'b.txt' },
      { name: 'a/abs', type: 'symlink', linkname: '/etc/passwd' },
      { name: 'a/hard', type: 'link', linkname: './a/b.txt' },
    ]);
    expect(await namesOf(out)).toEqual(['directory:a/', 'file:a/b.txt', 'symlink:a/link->b.txt', 'symlink:a/abs->/etc/passwd', 'link:a/hard->a/b.txt']);
  });

  it.each<[string, Entry[]]>([
    ['dot-dot', [{ name: 'a/../../x', content: 'x' }]],
    ['absolute', [{ name: '/etc/passwd', content: 'x' }]],
    ['symlink climbing out', [{ name: 'a/up', type: 'symlink', linkname: '../../x' }]],
    ['write through own symlink', [{ name: 's', type: 'symlink', linkname: '/etc' }, { name: 's/passwd', content: 'x' }]],
    ['write through own symlink, redeclared as a dir', [{ name: 's', type: 'symlink', linkname: 'd' }, { name: 's/', type: 'directory' }, { name: 's/x', content: 'x' }]],
    ['hardlink outside', [{ name: 'h', type: 'link', linkname: '../etc/passwd' }]],
    ['hardlink to a symlink', [{ name: 's', type: 'symlink', linkname: 'x' }, { name: 'h', type: 'link', linkname: 's' }]],
    ['device', [{ name: 'null', type: 'character-device', devmajor: 1, devminor: 3 }]],
    ['fifo', [{ name: 'p', type: 'fifo' }]],
  ])('refuses %s with invalid_archive', async (_what, entries) => {
    await expect(check(entries)).rejects.toMatchObject({ code: 'invalid_archive' });
  });

  it('refuses garbage and too many entries', async () => {
    await expect(checkFilesArchive(Buffer.from('not a tar'.repeat(100)), { maxEntries: 10 })).rejects.toMatchObject({ code: 'invalid_archive' });
    const many = await tarOf(Array.from({ length: 11 }, (_, i) => ({ name: `f${i}`, content: '' })));
    await expect(checkFilesArchive(many, { maxEntries: 10 })).rejects.toMatchObject({ code: 'payload_too_large' });
  });
});

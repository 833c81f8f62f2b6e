import { describe, expect, it } from 'vitest';
import { parseEntries } from './files-meta.ts';

describe('parseEntries', () => {
  it('reads stat triples: type and permission bits from the raw mode, symlink targets, names after the last slash', () => {
    const out = Buffer.from('41ed 4096 1700000000 root root drwxr-xr-x\0/work/d\0\0a1ff 6 1700000001 user staff lrwxrwxrwx\0/work/l\0/etc/x\0');
    expect(parseEntries(out)).toEqual([
      { name: 'd', path: '/work/d', type: 'directory', sizeBytes: 4096, mode: 0o755, permissions: 'drwxr-xr-x', owner: 'root', group: 'root', modifiedAt: '2023-11-14T22:13:20.000Z' },
      { name: 'l', path: '/work/l', type: 'symlink', sizeBytes: 6, mode: 0o777, permissions: 'lrwxrwxrwx', owner: 'user', group: 'staff', modifiedAt: '2023-11-14T22:13:21.000Z', symlinkTarget: '/etc/x' },
    ]);
    expect(parseEntries(Buffer.from('2190 0 0 root root prw-------\0/p\0\0'))[0]).toMatchObject({ type: 'other', name: 'p' });
    expect(parseEntries(Buffer.alloc(0))).toEqual([]);
  });
});

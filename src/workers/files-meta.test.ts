import { describe, expect, it } from 'vitest';
import { parseEntries } from './files-meta.ts';

describe('parseEntries', () => {
  it('reads stat fields: type and permission bits from the raw mode, symlink targets and what they resolve to, names after the last slash', () => {
    const out = Buffer.from('41ed 4096 1700000000 root root drwxr-xr-x\x00/work/d\x00\x00\x00a1ff 6 1700000001 user staff lrwxrwxrwx\x00/work/l\x00x\x0081a4 /etc/x\x00a1ff 4 0 root root lrwxrwxrwx\x00/dangling\x00nope\x00\x00');
    expect(parseEntries(out)).toEqual([
      { name: 'd', path: '/work/d', type: 'directory', sizeBytes: 4096, mode: 0o755, permissions: 'drwxr-xr-x', owner: 'root', group: 'root', modifiedAt: '2023-11-14T22:13:20.000Z' },
      { name: 'l', path: '/work/l', type: 'symlink', sizeBytes: 6, mode: 0o777, permissions: 'lrwxrwxrwx', owner: 'user', group: 'staff', modifiedAt: '2023-11-14T22:13:21.000Z', symlinkTarget: 'x', resolved: { path: '/etc/x', type: 'file', mode: 0o644 } },
      { name: 'dangling', path: '/dangling', type: 'symlink', sizeBytes: 4, mode: 0o777, permissions: 'lrwxrwxrwx', owner: 'root', group: 'root', modifiedAt: '1970-01-01T00:00:00.000Z', symlinkTarget: 'nope' },
    ]);
    expect(parseEntries(Buffer.from('2190 0 0 root root prw-------\x00/p\x00\x00\x00'))[0]).toMatchObject({ type: 'other', name: 'p' });
    expect(parseEntries(Buffer.alloc(0))).toEqual([]);
  });
});

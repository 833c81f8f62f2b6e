import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const TESTS = path.resolve(import.meta.dirname, '../../test');

describe('the integration suite', () => {
  // Files run two at once on one host, and a worker node id names host-wide state (its cgroup
  // parent, nft table, microVM RAM dir): a worker starting removes what of it it does not know,
  // which would be another file's sandboxes if two files shared the id.
  it('gives each worker node id to one test file only', () => {
    const filesOf = new Map<string, string[]>();
    for (const name of readdirSync(TESTS).filter((n) => n.endsWith('.test.ts'))) {
      const ids = new Set([...readFileSync(path.join(TESTS, name), 'utf8').matchAll(/nodeId: '([\w-]+)'/g)].map((m) => m[1]!));
      for (const id of ids) filesOf.set(id, [...(filesOf.get(id) ?? []), name]);
    }
    expect(filesOf.size).toBeGreaterThan(50);
    expect([...filesOf].filter(([, files]) => files.length > 1)).toEqual([]);
  });
});

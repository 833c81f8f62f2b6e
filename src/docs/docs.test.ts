import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { generatedDocs } from './index.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');

describe('generated docs', () => {
  it('match the code (run `npm run docs` after changing the env schema or the error table)', () => {
    for (const [file, text] of Object.entries(generatedDocs())) expect(readFileSync(path.join(ROOT, file), 'utf8'), file).toBe(text);
  });
});

describe('documentation links', () => {
  it('every relative link of the README and docs/ resolves inside the repository', () => {
    const pages = ['README.md', ...readdirSync(path.join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)];
    const broken: string[] = [];
    for (const page of pages) {
      const text = readFileSync(path.join(ROOT, page), 'utf8');
      for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/.test(target!) || target!.startsWith('#')) continue;
        const file = path.resolve(ROOT, path.dirname(page), target!.split('#')[0]!);
        if (!file.startsWith(`${ROOT}/`) || !existsSync(file)) broken.push(`${page}: ${target}`);
      }
    }
    expect(broken).toEqual([]);
  });
});

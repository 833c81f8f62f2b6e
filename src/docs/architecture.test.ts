import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = path.resolve(import.meta.dirname, '../..');
const PAGE = 'docs/architecture.md';

/** A code span naming a file of the repository, optionally `#function` or `#Class.method`. */
const REFERENCE = /`((?:src|scripts|clients|test)\/[^`\s#]+\.(?:ts|c|h|lua|py|sh))(?:#([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)?))?`/g;

interface CodeReference {
  file: string;
  name?: string;
}

function referencesOf(markdown: string): CodeReference[] {
  return [...markdown.matchAll(REFERENCE)].map(([, file, name]) => (name === undefined ? { file: file! } : { file: file!, name }));
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** Whether `source` (a TypeScript or C file's text) declares `name` (`Class.method` for a method). */
function declares(source: string, file: string, name: string): boolean {
  if (file.endsWith('.c') || file.endsWith('.h')) {
    return new RegExp(`^[A-Za-z_][\\w \\t*]*\\b${escape(name)}\\s*\\(`, 'm').test(source);
  }
  const [owner, member] = name.includes('.') ? name.split('.') : [undefined, name];
  if (owner === undefined) {
    return new RegExp(`\\b(?:function\\*?|const|let|class|interface|type|enum)\\s+${escape(member!)}\\b`).test(source);
  }
  const classAt = source.search(new RegExp(`\\bclass\\s+${escape(owner)}\\b`));
  if (classAt < 0) return false;
  const method = new RegExp(`^\\s+(?:(?:public|private|protected|static|async|readonly|override|get|set)\\s+)*\\*?${escape(member!)}\\s*[(<]`, 'm');
  return method.test(source.slice(classAt));
}

describe('docs/architecture.md', () => {
  const page = readFileSync(path.join(ROOT, PAGE), 'utf8');
  const references = referencesOf(page);

  it('names code (a page without references would pass the check below vacuously)', () => {
    expect(references.length).toBeGreaterThan(50);
  });

  it('names only files that exist and functions, classes and methods those files declare', () => {
    const broken: string[] = [];
    for (const { file, name } of references) {
      const full = path.join(ROOT, file);
      if (!existsSync(full)) broken.push(`${file}: no such file`);
      else if (name !== undefined && !declares(readFileSync(full, 'utf8'), file, name)) broken.push(`${file}#${name}: not declared there`);
    }
    expect(broken).toEqual([]);
  });

  it('answers where a create is placed, where an exec reaches the init and where a batch task is retried, each with a file', () => {
    for (const question of ['Where a create is placed', 'Where an exec reaches the init', 'Where a batch task is retried']) {
      const answer = new RegExp(`${question}: \`[^\`]+\``).exec(page);
      expect(answer, question).not.toBeNull();
      expect(referencesOf(answer![0]).length, question).toBe(1);
    }
  });

  it('is linked from the README', () => {
    const readme = readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    expect(readme.split('\n').slice(0, 20).join('\n')).toContain(`(${PAGE})`);
  });
});

describe('the reference check', () => {
  const source = 'export class Box {\n  private async open(x: number) {}\n  async *stream() {}\n}\nexport function place() {}\nstatic void do_spawn(struct s *s) {}\n';
  it('finds declared functions, classes and methods and refuses others', () => {
    expect(declares(source, 'a.ts', 'Box')).toBe(true);
    expect(declares(source, 'a.ts', 'Box.open')).toBe(true);
    expect(declares(source, 'a.ts', 'Box.stream')).toBe(true);
    expect(declares(source, 'a.ts', 'place')).toBe(true);
    expect(declares(source, 'a.ts', 'Box.place')).toBe(false);
    expect(declares(source, 'a.ts', 'Crate.open')).toBe(false);
    expect(declares(source, 'a.ts', 'opened')).toBe(false);
    expect(declares(source, 'a.c', 'do_spawn')).toBe(true);
    expect(declares(source, 'a.c', 'do_spawned')).toBe(false);
  });
});

import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const SRC = path.resolve(import.meta.dirname, '..');
const PYTHON_CLIENT = path.resolve(SRC, '../clients/python/rollbox');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const full = path.join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(full);
    return e.name.endsWith('.ts') && !e.name.endsWith('.test.ts') ? [full] : [];
  });
}

/** Relative imports of a module, type-only ones included (they tie the modules' designs too). */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/^(?:import|export)\s[^;]*?from\s+'(\.[^']+)'/gms)].map((m) => path.resolve(path.dirname(file), m[1]!));
}

/** Every cycle of a directed graph (one per strongly connected component of two or more), as `a -> b -> a`. */
function cyclesIn(edges: ReadonlyMap<string, readonly string[]>): string[] {
  const cycles: string[] = [];
  const state = new Map<string, 'visiting' | 'done'>();
  const visit = (node: string, trail: string[]): void => {
    state.set(node, 'visiting');
    for (const next of edges.get(node) ?? []) {
      if (state.get(next) === 'visiting') cycles.push([...trail.slice(trail.indexOf(next)), node, next].join(' -> '));
      else if (!state.has(next)) visit(next, [...trail, node]);
    }
    state.set(node, 'done');
  };
  for (const node of edges.keys()) if (!state.has(node)) visit(node, []);
  return cycles;
}

describe('module structure', () => {
  it('has no import cycles between the modules (folders) of src/; a folder and its subfolders count as one', () => {
    const moduleOf = (file: string) => path.relative(SRC, path.dirname(file));
    const edges = new Map<string, Set<string>>();
    for (const file of sourceFiles(SRC)) {
      const from = moduleOf(file);
      for (const target of importsOf(file)) {
        const to = moduleOf(target);
        // A folder and its subfolders are one module's parts (gateway and gateway/routes).
        const related = to === from || to.startsWith(`${from}/`) || from.startsWith(`${to}/`);
        if (!related && !to.startsWith('..')) edges.set(from, (edges.get(from) ?? new Set()).add(to));
      }
    }
    expect(cyclesIn(new Map([...edges].map(([from, to]) => [from, [...to]])))).toEqual([]);
  });

  it('has no import cycles between the files of src/ either (type-only imports count)', () => {
    const edges = new Map(sourceFiles(SRC).map((file) => [path.relative(SRC, file), importsOf(file).map((target) => path.relative(SRC, target))]));
    expect(cyclesIn(edges)).toEqual([]);
  });

  it('has no import cycles between the Python client\'s modules (imports under TYPE_CHECKING and inside functions count)', () => {
    const modules = readdirSync(PYTHON_CLIENT).filter((f) => f.endsWith('.py')).map((f) => f.slice(0, -'.py'.length));
    const edges = new Map(modules.filter((m) => m !== '__init__').map((m) => {
      const text = readFileSync(path.join(PYTHON_CLIENT, `${m}.py`), 'utf8');
      // `from .x import y` and `from . import x [as y], z`, at any indentation.
      const named = [...text.matchAll(/^\s*from \.([A-Za-z_]\w*) import /gm)].map((i) => i[1]!);
      const bare = [...text.matchAll(/^\s*from \. import ([^\n(]+)/gm)].flatMap((i) => i[1]!.split(',').map((part) => part.trim().split(/\s+/)[0]!));
      return [m, [...named, ...bare].filter((target) => modules.includes(target))];
    }));
    expect(cyclesIn(edges)).toEqual([]);
  });

  it('keeps every file in src/ under ~350 lines, or says at its top why not', () => {
    const long = sourceFiles(SRC)
      .concat(readdirSync(path.join(SRC, 'workers/init')).filter((f) => f.endsWith('.c')).map((f) => path.join(SRC, 'workers/init', f)))
      .filter((file) => {
        const text = readFileSync(file, 'utf8');
        return text.split('\n').length > 360 && !/^(?:\/\*\*?|\/\/)[^]*?Longer than most/m.test(text.slice(0, 3000));
      })
      .map((file) => path.relative(SRC, file));
    expect(long).toEqual([]);
  });
});

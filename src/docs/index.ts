import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { z } from 'zod';
import { ERROR_CODES } from '../api/index.ts';
import { Env } from '../config/index.ts';

/**
 * Reference pages generated from the code, so they cannot drift from it: the environment
 * variables (src/config) and the error codes (src/api/errors.ts). `npm run docs` writes
 * them; a unit test fails when a committed page differs from what the code says.
 */

const cell = (text: string): string => text.replace(/\|/g, '\\|').replace(/\n/g, ' ');

function defaultOf(schema: z.ZodType): string {
  const def = (schema as unknown as { def: { type: string; defaultValue?: unknown } }).def;
  if (def.type !== 'default') return '';
  const value = def.defaultValue;
  return value === '' ? '(empty)' : `\`${String(value)}\``;
}

export function configurationMarkdown(): string {
  const rows = Object.entries(Env.shape).map(([name, schema]) => `| \`${name}\` | ${defaultOf(schema)} | ${cell(schema.description ?? '')} |`);
  return [
    '# Configuration',
    '',
    '<!-- Generated from src/config/index.ts by `npm run docs`; edit the descriptions there. -->',
    '',
    'rollbox reads its environment once, at start (`loadConfig`); command-line flags (`--port`,',
    '`--data-dir`, `--node-id`) override the variables they name. Every gateway and worker',
    'host of a cluster needs the same `REDIS_URL`, `ROLLBOX_LAYER_STORE` and JWT settings.',
    '',
    '| variable | default | meaning |',
    '|---|---|---|',
    ...rows,
    '',
  ].join('\n');
}

export function errorCodesMarkdown(): string {
  const rows = Object.entries(ERROR_CODES).map(([code, { status, meaning }]) => `| \`${code}\` | ${status} | ${cell(meaning)} |`);
  return [
    '# Error codes',
    '',
    '<!-- Generated from src/api/errors.ts by `npm run docs`; edit the table there. -->',
    '',
    'Every error answer is `{"error": {"code", "message"}}` with one of these codes; 429 and',
    '503 answers carry `Retry-After`. Worker hosts report errors with the same codes.',
    '',
    '| code | HTTP status | meaning |',
    '|---|---|---|',
    ...rows,
    '',
  ].join('\n');
}

/** The generated pages, by path relative to the repository root. */
export function generatedDocs(): Record<string, string> {
  return { 'docs/configuration.md': configurationMarkdown(), 'docs/errors.md': errorCodesMarkdown() };
}

/** Writes the generated pages under `rootDir`; returns the paths that changed. */
export function writeGeneratedDocs(rootDir: string): string[] {
  const changed: string[] = [];
  for (const [file, text] of Object.entries(generatedDocs())) {
    const target = path.join(rootDir, file);
    const current = (() => {
      try {
        return readFileSync(target, 'utf8');
      } catch {
        return undefined;
      }
    })();
    if (current === text) continue;
    writeFileSync(target, text);
    changed.push(file);
  }
  return changed;
}

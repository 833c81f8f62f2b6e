import type { z } from 'zod';
import { issuesText } from '../api/index.ts';

/** A stored record parsed with the schema its readers use, or why it does not parse (field paths and messages only, never its content). */
export function parseRecord<T>(schema: z.ZodType<T>, json: string): { ok: true; value: T } | { ok: false; issues: string } {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch {
    return { ok: false, issues: 'not JSON' };
  }
  const parsed = schema.safeParse(raw);
  if (parsed.success) return { ok: true, value: parsed.data };
  return { ok: false, issues: issuesText(parsed.error) };
}

const DIGEST = /^sha256:[0-9a-f]{64}$/;

/** The layer digests an image record's JSON names, whether or not the rest of it parses. */
export function layerDigestsIn(json: string): string[] {
  try {
    const layers = (JSON.parse(json) as { layers?: unknown }).layers;
    return Array.isArray(layers) ? layers.flatMap((l: unknown) => (typeof (l as { digest?: unknown })?.digest === 'string' && DIGEST.test((l as { digest: string }).digest) ? [(l as { digest: string }).digest] : [])) : [];
  } catch {
    return [];
  }
}

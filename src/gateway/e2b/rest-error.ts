import type { Context } from 'hono';
import { RollboxError, httpStatusOf } from '../../api/index.ts';

/**
 * E2B's REST error body, on the control plane and envd's `/files` alike:
 * `{code: <HTTP status>, message}`. The SDK reads the body's code, not the status
 * (a 404 body makes `kill()` false, a 404 on `/files` is its FileNotFoundError).
 */
export function restError(c: Context, err: unknown): Response {
  const e = err instanceof RollboxError ? err : new RollboxError('internal', err instanceof Error ? err.message : String(err));
  const status = httpStatusOf(e.code);
  return c.json({ code: status, message: e.message }, status as 400);
}

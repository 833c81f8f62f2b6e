import { z } from 'zod';
import { ERROR_CODES, type ErrorCode } from './errors.ts';

export const ErrorBody = z.object({
  error: z.object({
    code: z.enum(Object.keys(ERROR_CODES) as [ErrorCode, ...ErrorCode[]]),
    message: z.string(),
  }),
});
export type ErrorBody = z.infer<typeof ErrorBody>;

/**
 * A zod error as `field.path: message; ...` for an error message: the fields refused (path
 * segments cut short: record keys are anyone's text) and the schema's own messages, never
 * the values refused; at most 300 characters.
 */
export function issuesText(error: z.ZodError, under: readonly PropertyKey[] = []): string {
  return error.issues.map((i) => `${[...under, ...i.path].map((p) => String(p).slice(0, 40)).join('.') || '(root)'}: ${i.message}`).join('; ').slice(0, 300);
}

export const SCOPES = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot', 'sandbox:policy', 'sandbox:run', 'batch:submit', 'rollout:submit', 'model:call', 'layer:write', 'layer:read', 'layer:host', 'image:build', 'burst:admin', 'cluster:read', 'admin'] as const;
export const Scope = z.enum(SCOPES);
export type Scope = z.infer<typeof Scope>;

/** A hosted rollout's key (src/iam/rollout-keys.ts): its agent's ROLLBOX_TOKEN, OPENAI_API_KEY and ANTHROPIC_API_KEY. */
export const ROLLOUT_KEY_PATTERN = /^rbr_[0-9a-f]{40}$/;

import type { ErrorCode } from '../api/index.ts';

/** An error answer from the API, with its code from the error table. */
export class RollboxApiError extends Error {
  override readonly name = 'RollboxApiError';
  constructor(
    readonly status: number,
    readonly code: ErrorCode | 'network',
    message: string,
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
  }
}

/** Statuses worth another try: the request may not have been served, or may succeed later. */
const RETRYABLE_STATUS = new Set([429, 502, 503, 504]);
const RETRYABLE_CODES = new Set(['timeout', 'no_capacity', 'admission_exhausted', 'unavailable', 'quota_exceeded']);

export async function apiErrorOf(response: Response): Promise<RollboxApiError> {
  const text = await response.text().catch(() => '');
  let apiError: { code?: ErrorCode; message?: string } | undefined;
  try {
    apiError = (JSON.parse(text) as { error?: typeof apiError }).error;
  } catch {
    apiError = undefined;
  }
  const retryAfter = Number(response.headers.get('retry-after') ?? NaN);
  return new RollboxApiError(response.status, apiError?.code ?? 'internal', apiError?.message ?? `HTTP ${response.status}`, Number.isFinite(retryAfter) ? retryAfter : undefined);
}

/** fetch's own message is "fetch failed": add its cause (ECONNREFUSED, a reset...). */
export function networkMessage(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = err.cause instanceof Error ? err.cause.message : undefined;
  return cause && !err.message.includes(cause) ? `${err.message}: ${cause}` : err.message;
}

/** Whether another try may succeed: the request may not have been served, or the refusal may pass. */
export function isRetryable(error: RollboxApiError): boolean {
  if (error.code === 'network') return true;
  if (!RETRYABLE_STATUS.has(error.status)) return false;
  // A 502 is a host or a registry gone for a moment, unless the registry refused the credentials (trying again changes nothing).
  return error.status === 502 ? error.code !== 'node_lost' && error.code !== 'registry_unauthorized' : RETRYABLE_CODES.has(error.code);
}

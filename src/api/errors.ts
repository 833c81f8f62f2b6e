/**
 * The one table of error codes. Handlers throw `RollboxError` with a code; only the
 * gateway's error handler turns a code into an HTTP status (see `httpStatusOf`).
 */
export const ERROR_CODES = {
  invalid_request: 400,
  invalid_layer: 400,
  /** A tar for the files API that names paths outside its directory, or is malformed. */
  invalid_archive: 400,
  unauthenticated: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  invalid_state: 409,
  /** A command's worker host died while it ran: it may or may not have taken effect. */
  result_unknown: 409,
  payload_too_large: 413,
  quota_exceeded: 429,
  internal: 500,
  admission_exhausted: 503,
  no_capacity: 503,
  unavailable: 503,
  timeout: 504,
  node_lost: 502,
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

export class RollboxError extends Error {
  override readonly name = 'RollboxError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    /** Seconds a client should wait before retrying (sent as Retry-After). */
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
  }
}

export function httpStatusOf(code: ErrorCode): number {
  return ERROR_CODES[code];
}

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && Object.hasOwn(ERROR_CODES, value);
}

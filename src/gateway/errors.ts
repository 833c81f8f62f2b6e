import type { Context } from 'hono';
import { HTTPException } from 'hono/http-exception';
import type { Logger } from 'pino';
import type { ZodError } from 'zod';
import { RollboxError, httpStatusOf, type ErrorBody, type ErrorCode } from '../api/index.ts';
import { isRedisUnavailable } from '../redis/index.ts';

/** What a client is told to wait before retrying a request that met Redis unavailable (a failover takes seconds). */
const REDIS_UNAVAILABLE_RETRY_AFTER_SEC = 2;

/** The one place that turns errors into HTTP responses. */
export function errorResponse(c: Context, code: ErrorCode, message: string, retryAfterSeconds?: number): Response {
  if (retryAfterSeconds !== undefined) c.header('Retry-After', String(retryAfterSeconds));
  // The body was not read: the connection cannot carry another request, tell the client.
  if (code === 'payload_too_large') c.header('Connection', 'close');
  const body: ErrorBody = { error: { code, message } };
  return c.json(body, httpStatusOf(code) as 400);
}

export function handleError(logger: Logger) {
  return (err: Error, c: Context): Response => {
    if (err instanceof RollboxError) return errorResponse(c, err.code, err.message, err.retryAfterSeconds);
    if (err instanceof HTTPException) {
      if (err.status === 413) return errorResponse(c, 'payload_too_large', 'request body is larger than the limit');
      if (err.status === 400) return errorResponse(c, 'invalid_request', err.message || 'malformed request');
      // A JSON route sent another content type (zod-openapi's media-type gate): bad input, not ours.
      if (err.status === 415) return errorResponse(c, 'invalid_request', 'the body must be JSON (content-type: application/json)');
      if (err.status === 401) return errorResponse(c, 'unauthenticated', err.message || 'unauthenticated');
    }
    if (isRedisUnavailable(err)) {
      logger.warn({ err: err.message, path: c.req.path }, 'redis unavailable');
      return errorResponse(c, 'unavailable', `Redis is not available now (${err.message.slice(0, 200)}); retrying with the same Idempotency-Key or commandId is safe`, REDIS_UNAVAILABLE_RETRY_AFTER_SEC);
    }
    logger.error({ err, path: c.req.path }, 'unhandled error');
    return errorResponse(c, 'internal', 'internal error');
  };
}

/** Validation errors name the field: `resources.memoryMiB: Too big: expected number to be <=262144`. */
export function describeZodError(error: ZodError, where: string): string {
  return error.issues
    .slice(0, 10)
    .map((issue) => {
      // Record keys and unknown keys are the caller's text: cut short, so an answer never echoes a huge one.
      const path = [where, ...issue.path.map((p) => String(p).slice(0, 64))].filter(Boolean).join('.');
      const keys = 'keys' in issue && Array.isArray(issue.keys) ? ` (${issue.keys.slice(0, 10).map((k) => String(k).slice(0, 64)).join(', ')})` : '';
      return `${path || where}: ${issue.message}${keys}`;
    })
    .join('; ');
}

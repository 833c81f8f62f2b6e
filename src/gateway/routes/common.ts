import { Readable } from 'node:stream';
import type { OpenAPIHono } from '@hono/zod-openapi';
import type { Context } from 'hono';
import { z } from '@hono/zod-openapi';
import { ERROR_CODES, ErrorBody, RollboxError, type ErrorCode } from '../../api/index.ts';
import { requireScope, type Principal } from '../../iam/index.ts';
import type { GatewayEnv } from '../auth.ts';

export type GatewayApp = OpenAPIHono<GatewayEnv>;

export const json = <T extends z.ZodType>(schema: T, description: string) => ({ description, content: { 'application/json': { schema } } });
export const jsonBody = <T extends z.ZodType>(schema: T) => ({ required: true, content: { 'application/json': { schema } } });
export const IdParam = z.object({ id: z.string().max(64) });
export const security = [{ bearer: [] }];

/** What any route behind a token may answer. */
const ANY_ROUTE: ErrorCode[] = ['invalid_request', 'unauthenticated', 'forbidden', 'internal', 'unavailable'];

type ErrorResponses = Record<number, { description: string; content: { 'application/json': { schema: typeof ErrorBody } } }>;

/**
 * The OpenAPI error answers of a route, from the one code table: each status the route
 * may answer, described by the codes behind it.
 */
export function errors(...codes: ErrorCode[]): ErrorResponses {
  const byStatus = new Map<number, ErrorCode[]>();
  for (const code of new Set([...ANY_ROUTE, ...codes])) {
    const { status } = ERROR_CODES[code];
    byStatus.set(status, [...(byStatus.get(status) ?? []), code]);
  }
  return Object.fromEntries([...byStatus].map(([status, list]) => [status, { description: list.join(', '), content: { 'application/json': { schema: ErrorBody } } }]));
}

/** Layers are readable by whoever may create sandboxes from them or write them, and by worker hosts (`layer:host`); which ones, readerOf says. */
export function requireLayerRead(principal: Principal): void {
  if (principal.scopes.has('sandbox:create') || principal.scopes.has('layer:write') || principal.scopes.has('layer:host')) return;
  requireScope(principal, 'layer:read');
}

/**
 * A streamed upload (a layer tar, an image archive) handed to `use`. If it fails before
 * the body is read to its end, the answer closes the connection: a client must not send
 * its next request on a connection that still carries the rest of this body.
 */
export async function withUploadBody<T>(c: Context<GatewayEnv>, what: string, use: (body: Readable) => Promise<T>): Promise<T> {
  if (!c.req.raw.body) throw new RollboxError('invalid_request', `body: ${what} is required`);
  const body = Readable.fromWeb(c.req.raw.body as never);
  try {
    return await use(body);
  } catch (err) {
    if (!body.readableEnded) c.header('Connection', 'close');
    body.destroy();
    throw err;
  }
}

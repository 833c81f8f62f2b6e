import type { Context } from 'hono';
import type { z } from 'zod';
import { RollboxError, type ErrorCode } from '../../api/index.ts';
import { describeZodError } from '../errors.ts';

/**
 * The Connect protocol as envd speaks it to the SDK (JSON codec, HTTP/1.1; the spec is
 * connectrpc.com's docs/protocol.md): unary calls are bare JSON both ways, errors a
 * non-200 with `{code, message}`; a server stream answers 200 with enveloped messages
 * (flags u8, length u32 big-endian, JSON), the last one flagged end-of-stream (0x02)
 * carrying `{}` or `{error}`. Nothing is ever compressed.
 */

export type ConnectCode =
  | 'canceled'
  | 'unknown'
  | 'invalid_argument'
  | 'deadline_exceeded'
  | 'not_found'
  | 'already_exists'
  | 'permission_denied'
  | 'resource_exhausted'
  | 'failed_precondition'
  | 'aborted'
  | 'unimplemented'
  | 'internal'
  | 'unavailable'
  | 'unauthenticated';

/** The HTTP status of each code (the spec's table). */
const STATUS: Record<ConnectCode, number> = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  aborted: 409,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  unauthenticated: 401,
};

/** An error to answer in Connect's terms (thrown by the envd handlers). */
export class ConnectError extends Error {
  constructor(
    readonly code: ConnectCode,
    message: string,
    /** E2B's proxy answers 502 for a sandbox that is gone; the SDK reads it as the sandbox's end. */
    readonly httpStatus = STATUS[code],
  ) {
    super(message);
  }
}

const FROM_ROLLBOX: Partial<Record<ErrorCode, ConnectCode>> = {
  invalid_request: 'invalid_argument',
  invalid_archive: 'invalid_argument',
  unauthenticated: 'unauthenticated',
  forbidden: 'permission_denied',
  not_found: 'not_found',
  conflict: 'aborted',
  invalid_state: 'failed_precondition',
  result_unknown: 'unknown',
  payload_too_large: 'resource_exhausted',
  quota_exceeded: 'resource_exhausted',
  timeout: 'deadline_exceeded',
  unavailable: 'unavailable',
  no_capacity: 'unavailable',
  node_lost: 'unavailable',
};

export function toConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  if (err instanceof RollboxError) return new ConnectError(FROM_ROLLBOX[err.code] ?? 'internal', err.message);
  return new ConnectError('internal', err instanceof Error ? err.message : String(err));
}

export function connectErrorResponse(c: Context, err: unknown): Response {
  const e = toConnectError(err);
  return c.json({ code: e.code, message: e.message }, e.httpStatus as 400);
}

/** Largest request message accepted (a Start's command with its arguments and env). */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
const END_STREAM = 0x02;
const COMPRESSED = 0x01;

function parseJson<T extends z.ZodType>(schema: T, text: string): z.infer<T> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new ConnectError('invalid_argument', 'the message is not JSON');
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new ConnectError('invalid_argument', describeZodError(parsed.error, 'message'));
  return parsed.data;
}

async function bodyOf(c: Context): Promise<Buffer> {
  const declared = Number(c.req.header('content-length') ?? 0);
  if (declared > MAX_MESSAGE_BYTES + 5) throw new ConnectError('resource_exhausted', `message larger than ${MAX_MESSAGE_BYTES} bytes`);
  const body = Buffer.from(await c.req.arrayBuffer());
  if (body.length > MAX_MESSAGE_BYTES + 5) throw new ConnectError('resource_exhausted', `message larger than ${MAX_MESSAGE_BYTES} bytes`);
  return body;
}

/** A unary request: `application/json`, one bare message. */
export async function readUnary<T extends z.ZodType>(c: Context, schema: T): Promise<z.infer<T>> {
  const type = (c.req.header('content-type') ?? '').split(';')[0]!.trim();
  if (type !== 'application/json') throw new ConnectError('invalid_argument', `unary calls take application/json (the SDK's JSON codec), not ${type || 'no content type'}`);
  const body = await bodyOf(c);
  return parseJson(schema, body.length ? body.toString('utf8') : '{}');
}

/** A server-stream request: `application/connect+json`, exactly one enveloped message. */
export async function readStreamRequest<T extends z.ZodType>(c: Context, schema: T): Promise<z.infer<T>> {
  const type = (c.req.header('content-type') ?? '').split(';')[0]!.trim();
  if (type !== 'application/connect+json') throw new ConnectError('invalid_argument', `streaming calls take application/connect+json, not ${type || 'no content type'}`);
  const body = await bodyOf(c);
  if (body.length < 5) throw new ConnectError('invalid_argument', 'malformed envelope: shorter than its 5-byte header');
  const flags = body[0]!;
  const length = body.readUInt32BE(1);
  if (flags & COMPRESSED) throw new ConnectError('unimplemented', 'compressed messages are not accepted (send them uncompressed)');
  if (flags !== 0) throw new ConnectError('invalid_argument', `malformed envelope: flags ${flags}`);
  if (length > MAX_MESSAGE_BYTES) throw new ConnectError('resource_exhausted', `message larger than ${MAX_MESSAGE_BYTES} bytes`);
  if (body.length !== 5 + length) throw new ConnectError('invalid_argument', `malformed envelope: it says ${length} bytes and carries ${body.length - 5}`);
  return parseJson(schema, body.subarray(5).toString('utf8'));
}

/**
 * A client-stream request (`application/connect+json`): its enveloped messages as they
 * arrive, each checked against `schema`; the end-of-stream frame (or the body's end) ends it.
 */
export async function* readClientStream<T extends z.ZodType>(c: Context, schema: T): AsyncGenerator<z.infer<T>> {
  const type = (c.req.header('content-type') ?? '').split(';')[0]!.trim();
  if (type !== 'application/connect+json') throw new ConnectError('invalid_argument', `streaming calls take application/connect+json, not ${type || 'no content type'}`);
  const body = c.req.raw.body;
  if (!body) return;
  let pending = Buffer.alloc(0);
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= 5) {
      const flags = pending[0]!;
      const length = pending.readUInt32BE(1);
      if (flags & COMPRESSED) throw new ConnectError('unimplemented', 'compressed messages are not accepted (send them uncompressed)');
      if (flags & ~END_STREAM) throw new ConnectError('invalid_argument', `malformed envelope: flags ${flags}`);
      if (length > MAX_MESSAGE_BYTES) throw new ConnectError('resource_exhausted', `message larger than ${MAX_MESSAGE_BYTES} bytes`);
      if (pending.length < 5 + length) break;
      const message = pending.subarray(5, 5 + length).toString('utf8');
      pending = pending.subarray(5 + length);
      if (flags & END_STREAM) return;
      yield parseJson(schema, message);
    }
  }
  if (pending.length > 0) throw new ConnectError('invalid_argument', 'malformed envelope: the stream ended inside a message');
}

export function envelope(message: unknown, flags = 0): Uint8Array {
  const json = Buffer.from(JSON.stringify(message));
  const frame = Buffer.alloc(5 + json.length);
  frame[0] = flags;
  frame.writeUInt32BE(json.length, 1);
  json.copy(frame, 5);
  return frame;
}

/**
 * A server-stream answer: each message of `messages` as it comes, a keepalive message
 * whenever none came for `keepaliveMs`, then the end-of-stream frame (with the error that
 * ended the stream, if one did). Stops pulling when the client goes away.
 */
export function streamResponse(c: Context, messages: AsyncGenerator<unknown>, keepalive: { message: unknown; everyMs: number }): Response {
  let pending: Promise<IteratorResult<unknown>> | undefined;
  let timer: NodeJS.Timeout | undefined;
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        pending ??= messages.next();
        const tick = new Promise<'keepalive'>((resolve) => (timer = setTimeout(() => resolve('keepalive'), keepalive.everyMs)));
        const next = await Promise.race([pending, tick]);
        clearTimeout(timer);
        if (next === 'keepalive') return controller.enqueue(envelope(keepalive.message));
        pending = undefined;
        if (!next.done) return controller.enqueue(envelope(next.value));
        controller.enqueue(envelope({}, END_STREAM));
      } catch (err) {
        const e = toConnectError(err);
        controller.enqueue(envelope({ error: { code: e.code, message: e.message } }, END_STREAM));
      }
      controller.close();
    },
    async cancel() {
      clearTimeout(timer);
      await messages.return(undefined);
    },
  });
  return c.body(body, 200, { 'content-type': 'application/connect+json', 'cache-control': 'no-store' });
}

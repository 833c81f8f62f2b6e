import { Hono } from 'hono';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConnectError, envelope, readStreamRequest, streamResponse, toConnectError } from './connect.ts';
import { RollboxError } from '../../api/index.ts';

const Message = z.object({ n: z.number() });

/** A tiny app answering what readStreamRequest made of the body. */
const app = new Hono().post('/s', async (c) => {
  try {
    return c.json(await readStreamRequest(c, Message));
  } catch (err) {
    const e = toConnectError(err);
    return c.json({ code: e.code }, e.httpStatus as 400);
  }
});
const send = async (body: Uint8Array, type = 'application/connect+json') =>
  (await (await app.request('/s', { method: 'POST', headers: { 'content-type': type }, body: new Uint8Array(body) })).json()) as Record<string, unknown>;

describe('Connect framing', () => {
  it('reads one enveloped JSON message and refuses every malformed one with its code', async () => {
    const good = envelope({ n: 7 });
    expect(await send(good)).toEqual({ n: 7 });
    expect(await send(good.subarray(0, 4))).toEqual({ code: 'invalid_argument' });
    expect(await send(Buffer.concat([good, Buffer.from([0])]))).toEqual({ code: 'invalid_argument' });
    expect(await send(Buffer.from([1, ...good.subarray(1)]))).toEqual({ code: 'unimplemented' });
    expect(await send(Buffer.from([4, ...good.subarray(1)]))).toEqual({ code: 'invalid_argument' });
    expect(await send(envelope({ n: 'seven' }))).toEqual({ code: 'invalid_argument' });
    expect(await send(good, 'application/json')).toEqual({ code: 'invalid_argument' });
    const claimsHuge = Buffer.from(good);
    claimsHuge.writeUInt32BE(0xffffffff, 1);
    expect(await send(claimsHuge)).toEqual({ code: 'resource_exhausted' });
  });

  it('maps rollbox errors to Connect codes', () => {
    expect(toConnectError(new RollboxError('not_found', 'x')).code).toBe('not_found');
    expect(toConnectError(new RollboxError('invalid_request', 'x'))).toMatchObject({ code: 'invalid_argument', httpStatus: 400 });
    expect(toConnectError(new RollboxError('timeout', 'x')).code).toBe('deadline_exceeded');
    expect(toConnectError(new Error('boom'))).toMatchObject({ code: 'internal', httpStatus: 500 });
    expect(new ConnectError('unavailable', 'gone', 502).httpStatus).toBe(502);
  });

  it('streams messages, a keepalive while idle, then the end frame; an error ends the stream in that frame', async () => {
    const frames = async (gen: () => AsyncGenerator<unknown>) => {
      const res = await new Hono().post('/', (c) => streamResponse(c, gen(), { message: { k: 1 }, everyMs: 30 })).request('/', { method: 'POST' });
      expect(res.headers.get('content-type')).toBe('application/connect+json');
      const bytes = Buffer.from(await res.arrayBuffer());
      const out: [number, unknown][] = [];
      for (let at = 0; at < bytes.length; at += 5 + bytes.readUInt32BE(at + 1)) out.push([bytes[at]!, JSON.parse(bytes.subarray(at + 5, at + 5 + bytes.readUInt32BE(at + 1)).toString())]);
      return out;
    };
    const idle = await frames(async function* () {
      yield { a: 1 };
      await new Promise((r) => setTimeout(r, 80));
      yield { a: 2 };
    });
    // The 30 ms keepalive timer always fires before the 80 ms pause ends (timers run in deadline order).
    expect(idle[0]).toEqual([0, { a: 1 }]);
    expect(idle.slice(-2)).toEqual([[0, { a: 2 }], [2, {}]]);
    expect(idle.length).toBeGreaterThanOrEqual(4);
    expect(idle.slice(1, -2).every(([flags, m]) => flags === 0 && JSON.stringify(m) === '{"k":1}')).toBe(true);
    expect(
      await frames(async function* () {
        yield { a: 1 };
        throw new RollboxError('not_found', 'no such command');
      }),
    ).toEqual([[0, { a: 1 }], [2, { error: { code: 'not_found', message: 'no such command' } }]]);
  });
});

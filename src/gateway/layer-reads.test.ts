import { Hono } from 'hono';
import { describe, expect, it } from 'vitest';
import { RollboxError } from '../api/index.ts';
import type { GatewayEnv } from './auth.ts';
import { LayerReads } from './layer-reads.ts';

/** A route serving three pieces through `reads`, as `tokenId` (refusals as their code and Retry-After). */
function appOf(reads: LayerReads): Hono<GatewayEnv> {
  const app = new Hono<GatewayEnv>();
  app.get('/:token', async (c) => {
    c.set('principal', { tenant: 't', scopes: new Set(), tokenId: c.req.param('token') });
    try {
      return c.body(
        await reads.body(c, async function* () {
          for (let i = 0; i < 3; i++) yield Buffer.from(`piece${i}`);
        }),
      );
    } catch (err) {
      const e = err as RollboxError;
      return c.json({ code: e.code, retryAfter: e.retryAfterSeconds }, 503);
    }
  });
  return app;
}

describe('layer reads', () => {
  it('streams at most `perToken` for one token and `total` in all; the rest wait for a slot, then are refused retryably', async () => {
    const reads = new LayerReads({ total: 2, perToken: 1, queueMs: 200, idleMs: 10_000 });
    const app = appOf(reads);
    const a1 = await app.request('/a');
    expect(reads.streaming).toBe(1);
    // a's second waits; b's first goes beside a's.
    const a2 = app.request('/a');
    const b1 = await app.request('/b');
    expect(reads.streaming).toBe(2);
    // Both slots taken: c waits too; the queue holds at most `total`, the next is refused at once.
    const c1 = app.request('/c');
    const d1 = await app.request('/d');
    expect(await d1.json()).toEqual({ code: 'unavailable', retryAfter: 1 });
    // a1 read to its end frees its slot: a2 (the oldest waiter that fits) goes.
    expect(await a1.text()).toBe('piece0piece1piece2');
    const a2Answer = await a2;
    // c waited past queueMs behind b1 and a2 (not read yet): refused, coded and retryable.
    expect(await (await c1).json()).toEqual({ code: 'unavailable', retryAfter: 1 });
    expect(await a2Answer.text()).toBe('piece0piece1piece2');
    await b1.body!.cancel();
    expect(reads.streaming).toBe(0);
  });

  it('gives the slot back when the reader goes away or stops reading', async () => {
    const reads = new LayerReads({ total: 1, perToken: 1, queueMs: 50, idleMs: 100 });
    const app = appOf(reads);
    const gone = await app.request('/a');
    const reader = gone.body!.getReader();
    expect(new TextDecoder().decode((await reader.read()).value)).toBe('piece0');
    await reader.cancel();
    expect(reads.streaming).toBe(0);
    // Never read (a client that stopped): its slot back after idleMs.
    const stalled = await app.request('/b');
    expect(reads.streaming).toBe(1);
    await new Promise((r) => setTimeout(r, 150));
    expect(reads.streaming).toBe(0);
    await expect(stalled.text()).rejects.toThrow(/idle/);
    expect(await (await app.request('/c')).text()).toBe('piece0piece1piece2');
  });
});

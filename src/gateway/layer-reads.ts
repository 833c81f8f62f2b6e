import { createHash } from 'node:crypto';
import type { Context } from 'hono';
import { RollboxError } from '../api/index.ts';
import type { GatewayEnv } from './auth.ts';

export interface LayerReadLimits {
  /** Layer file reads streaming at once, all tokens together. */
  total: number;
  /** Of those, at most this many for one token. */
  perToken: number;
  /** How long a read past a cap waits for a slot before it is refused (503 `unavailable`, Retry-After). */
  queueMs: number;
  /** A read whose body nobody pulls this long (a client that stopped reading, a HEAD) gives its slot back. */
  idleMs: number;
}

interface Waiter {
  key: string;
  admit: () => void;
}

/** Seconds a refused reader is told to wait: a slot frees as soon as any read ends. */
const RETRY_AFTER_SECONDS = 1;

/**
 * The layer files a gateway serves (`GET /v1/layers/:ref/blob` and `/meta`: the origin of
 * hosts reading layers on demand, and downloads) go out as streams of pieces read from the
 * store one at a time as the socket takes them, so a read holds about two pieces whatever
 * its range, and at most `total` reads stream at once (`perToken` for one token): past
 * that a read waits for a slot (at most `queueMs`, while no more than `total` wait), else
 * it is refused, coded and retryable. Measured in test/gateway-memory.test.ts.
 */
export class LayerReads {
  private active = 0;
  private readonly byKey = new Map<string, number>();
  private readonly waiting: Waiter[] = [];

  constructor(private readonly limits: LayerReadLimits) {}

  /** Reads streaming now (for tests and metrics). */
  get streaming(): number {
    return this.active;
  }

  /**
   * The body of one read: `pieces` pulled as the client takes them, once a slot is free. The
   * slot is held until the body ends, fails, is cancelled (the client went), or idles.
   */
  async body(c: Context<GatewayEnv>, pieces: () => AsyncIterator<Buffer>): Promise<ReadableStream<Uint8Array>> {
    const release = await this.enter(readerOf(c));
    let source: AsyncIterator<Buffer> | undefined;
    let idle: NodeJS.Timeout | undefined;
    let ended = false;
    const end = (): void => {
      if (ended) return;
      ended = true;
      clearTimeout(idle);
      release();
      void source?.return?.().catch(() => undefined);
    };
    const arm = (controller: ReadableStreamDefaultController<Uint8Array>): void => {
      clearTimeout(idle);
      idle = setTimeout(() => {
        if (ended) return;
        end();
        controller.error(new RollboxError('timeout', `layer read idle for ${this.limits.idleMs} ms`));
      }, this.limits.idleMs);
      idle.unref();
    };
    return new ReadableStream<Uint8Array>(
      {
        start: (controller) => arm(controller),
        pull: async (controller) => {
          if (ended) return;
          clearTimeout(idle);
          try {
            source ??= pieces();
            const next = await source.next();
            if (next.done) {
              end();
              controller.close();
              return;
            }
            controller.enqueue(new Uint8Array(next.value.buffer, next.value.byteOffset, next.value.byteLength));
            arm(controller);
          } catch (err) {
            end();
            controller.error(err);
          }
        },
        cancel: () => end(),
      },
      // Nothing read ahead: a piece is read when the socket has taken the one before.
      { highWaterMark: 0 },
    );
  }

  /** A slot for `key`, waited for within the limits; answers its release (idempotent). */
  private async enter(key: string): Promise<() => void> {
    if (!this.fits(key)) {
      if (this.waiting.length >= this.limits.total) throw busy(`${this.waiting.length} layer reads wait already`);
      await new Promise<void>((resolve, reject) => {
        const waiter: Waiter = {
          key,
          admit: () => {
            clearTimeout(timer);
            resolve();
          },
        };
        const timer = setTimeout(() => {
          this.waiting.splice(this.waiting.indexOf(waiter), 1);
          reject(busy(`no layer read slot within ${this.limits.queueMs} ms`));
        }, this.limits.queueMs);
        this.waiting.push(waiter);
      });
    } else {
      this.take(key);
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.active--;
      const left = (this.byKey.get(key) ?? 1) - 1;
      if (left > 0) this.byKey.set(key, left);
      else this.byKey.delete(key);
      this.admitWaiting();
    };
  }

  private fits(key: string): boolean {
    return this.active < this.limits.total && (this.byKey.get(key) ?? 0) < this.limits.perToken;
  }

  private take(key: string): void {
    this.active++;
    this.byKey.set(key, (this.byKey.get(key) ?? 0) + 1);
  }

  /** The oldest waiters that fit now (one token at its cap does not hold back the others). */
  private admitWaiting(): void {
    for (let i = 0; i < this.waiting.length && this.active < this.limits.total; ) {
      const w = this.waiting[i]!;
      if (!this.fits(w.key)) {
        i++;
        continue;
      }
      this.waiting.splice(i, 1);
      this.take(w.key);
      w.admit();
    }
  }
}

function busy(why: string): RollboxError {
  return new RollboxError('unavailable', `the gateway is serving as many layer reads as it allows (${why}); retry`, RETRY_AFTER_SECONDS);
}

/** Who a read counts against: its token (by id when it has one, else by its bytes' hash, else its tenant and subject). */
function readerOf(c: Context<GatewayEnv>): string {
  const principal = c.get('principal');
  if (principal.tokenId) return `${principal.tenant}/${principal.tokenId}`;
  const credential = c.req.header('authorization') ?? c.req.header('x-api-key');
  if (credential) return createHash('sha256').update(credential).digest('base64');
  return `${principal.tenant}/${principal.subject ?? ''}`;
}

import type { Redis } from 'ioredis';
import { Reply, RollboxError } from '../api/index.ts';
import { keys } from '../registry/index.ts';

interface Waiter {
  resolve: (reply: Reply) => void;
  reject: (error: Error) => void;
  timer: NodeJS.Timeout;
}

/**
 * Replies from worker hosts come back on one pub/sub channel per gateway, so a gateway
 * holds one subscriber connection however many nodes there are. Pub/sub can drop a
 * message while the connection is down; callers treat a timeout as "look at the
 * registry", never as success.
 */
export class ReplyHub {
  private readonly waiters = new Map<string, Waiter>();
  readonly channel: string;

  constructor(
    private readonly subscriber: Redis,
    readonly gatewayId: string,
  ) {
    this.channel = keys.replyChannel(gatewayId);
    subscriber.on('message', (channel: string, message: string) => {
      if (channel !== this.channel) return;
      let reply: Reply;
      try {
        reply = Reply.parse(JSON.parse(message));
      } catch {
        return;
      }
      const waiter = this.waiters.get(reply.requestId);
      if (!waiter) return;
      this.waiters.delete(reply.requestId);
      clearTimeout(waiter.timer);
      waiter.resolve(reply);
    });
  }

  async start(): Promise<void> {
    await this.subscriber.subscribe(this.channel);
  }

  /** Registers interest before the request is sent, so a fast reply cannot be missed. */
  expect(requestId: string, timeoutMs: number): Promise<Reply> {
    return new Promise<Reply>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(requestId);
        reject(new RollboxError('timeout', `no reply within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.set(requestId, { resolve, reject, timer });
    });
  }

  cancel(requestId: string): void {
    const waiter = this.waiters.get(requestId);
    if (!waiter) return;
    clearTimeout(waiter.timer);
    this.waiters.delete(requestId);
  }

  async stop(): Promise<void> {
    for (const [id, waiter] of this.waiters) {
      clearTimeout(waiter.timer);
      waiter.reject(new RollboxError('unavailable', 'gateway shutting down'));
      this.waiters.delete(id);
    }
    await this.subscriber.quit().catch(() => {});
  }
}

export async function publishReply(redis: Redis, replyTo: string, reply: Reply): Promise<void> {
  await redis.publish(keys.replyChannel(replyTo), JSON.stringify(reply));
}

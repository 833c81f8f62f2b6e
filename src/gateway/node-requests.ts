import type { Queue } from 'bullmq';
import { RollboxError, type Reply } from '../api/index.ts';
import type { ReplyHub } from '../queues/index.ts';

export interface QueueProvider {
  createQueue(nodeId: string): Queue;
  opsQueue(nodeId: string): Queue;
}

/** Requests to worker hosts: send through a node's queue, wait for the reply on this gateway's channel. */
export class NodeRequests {
  constructor(private readonly replies: ReplyHub) {}

  /** Registers for the reply first, then sends, so a fast reply cannot be missed. */
  async request(requestId: string, timeoutMs: number, send: () => Promise<unknown>): Promise<Reply> {
    const reply = this.replies.expect(requestId, timeoutMs);
    try {
      await send();
    } catch (err) {
      this.replies.cancel(requestId);
      throw err;
    }
    return reply;
  }
}

/** A worker host's error reply as a typed error (codes it may send; anything else is internal). */
export function toRollboxError(error: { code: string; message: string; retryAfterSeconds?: number }): RollboxError {
  const known = ['invalid_state', 'not_found', 'conflict', 'timeout', 'invalid_request', 'result_unknown'] as const;
  const code = (known as readonly string[]).includes(error.code) ? (error.code as (typeof known)[number]) : 'internal';
  return new RollboxError(code, error.message, error.retryAfterSeconds);
}

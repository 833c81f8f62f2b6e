import type { Queue } from 'bullmq';
import { RollboxError, type CreateJob, type NodeOp, type Reply } from '../api/index.ts';
import type { ReplyHub } from '../queues/index.ts';

export interface QueueProvider {
  createQueue(nodeId: string): Queue;
  opsQueue(nodeId: string): Queue;
}

/** A node operation or create job as a caller writes it: the reply address is filled in here. */
type Outgoing<T> = T extends unknown ? Omit<T, 'replyTo'> : never;

/**
 * Requests to worker hosts: sent through the node's queue (the BullMQ job id is the
 * request id, so a resend is idempotent), answered on this gateway's reply channel.
 */
export class NodeRequests {
  constructor(
    private readonly replies: ReplyHub,
    private readonly queues: QueueProvider,
  ) {}

  /** Sends an operation and waits for its reply. */
  sendOp(nodeId: string, op: Outgoing<NodeOp>, timeoutMs: number): Promise<Reply> {
    return this.request(op.requestId, timeoutMs, () => this.postOp(nodeId, op));
  }

  /** Sends an operation without waiting for a reply (the command log carries the outcome). */
  async postOp(nodeId: string, op: Outgoing<NodeOp>): Promise<void> {
    await this.queues.opsQueue(nodeId).add(op.kind, { ...op, replyTo: this.replies.gatewayId } as NodeOp, { jobId: op.requestId });
  }

  sendCreate(nodeId: string, job: Outgoing<CreateJob>, timeoutMs: number): Promise<Reply> {
    return this.request(job.requestId, timeoutMs, () => this.queues.createQueue(nodeId).add('create', { ...job, replyTo: this.replies.gatewayId } satisfies CreateJob, { jobId: job.requestId }));
  }

  /** Stops waiting for a reply (it is no longer needed, or it will never come). */
  cancel(requestId: string): void {
    this.replies.cancel(requestId);
  }

  /** Registers for the reply first, then sends, so a fast reply cannot be missed. */
  private async request(requestId: string, timeoutMs: number, send: () => Promise<unknown>): Promise<Reply> {
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
  const known = ['invalid_state', 'not_found', 'conflict', 'timeout', 'invalid_request', 'result_unknown', 'payload_too_large'] as const;
  const code = (known as readonly string[]).includes(error.code) ? (error.code as (typeof known)[number]) : 'internal';
  return new RollboxError(code, error.message, error.retryAfterSeconds);
}

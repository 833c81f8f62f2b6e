import type { Redis } from 'ioredis';
import { RollboxError, isErrorCode, type CreateJob, type NodeOp, type Reply, type Sandbox } from '../api/index.ts';
import { pushToInbox, type ReplyHub } from '../queues/index.ts';
import type { CreateJobQueues } from '../queues/jobs/index.ts';

/** A node operation or create job as a caller writes it: the reply address is filled in here. */
type Outgoing<T> = T extends unknown ? Omit<T, 'replyTo'> : never;

/**
 * Requests to worker hosts, answered on this gateway's reply channel: creates as BullMQ
 * jobs on the node's create queue (src/queues/jobs), operations on its sandboxes pushed to
 * the node's ops inbox (src/queues/inbox.ts: the direct path, a few Redis calls each).
 */
export class NodeRequests {
  constructor(
    private readonly replies: ReplyHub,
    private readonly redis: Redis,
    private readonly createJobs: Pick<CreateJobQueues, 'add'>,
  ) {}

  get gatewayId(): string {
    return this.replies.gatewayId;
  }

  /** Sends an operation and waits for its reply. */
  sendOp(nodeId: string, op: Outgoing<NodeOp>, timeoutMs: number): Promise<Reply> {
    return this.request(op.requestId, timeoutMs, () => this.postOp(nodeId, op));
  }

  /** Sends an operation without waiting for a reply (the command log carries the outcome). */
  async postOp(nodeId: string, op: Outgoing<NodeOp>): Promise<void> {
    await pushToInbox(this.redis, nodeId, 'ops', this.addressed(op));
  }

  sendCreate(nodeId: string, job: Outgoing<CreateJob>, timeoutMs: number): Promise<Reply> {
    return this.request(job.requestId, timeoutMs, () => this.createJobs.add<CreateJob>(nodeId, { ...job, replyTo: this.gatewayId }));
  }

  /** The op as its inbox message (for callers that push it inside their own script). */
  addressed(op: Outgoing<NodeOp>): NodeOp {
    return { ...op, replyTo: this.gatewayId } as NodeOp;
  }

  /** Registers for a reply before the request that will cause it is sent. */
  expect(requestId: string, timeoutMs: number): Promise<Reply> {
    return this.replies.expect(requestId, timeoutMs);
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

/** A worker host's error reply as the typed error it was on the worker (unknown codes become internal). */
export function toRollboxError(error: { code: string; message: string; retryAfterSeconds?: number }): RollboxError {
  return new RollboxError(isErrorCode(error.code) ? error.code : 'internal', error.message, error.retryAfterSeconds);
}

/** A create that ended in a failure answers with an error naming it, not with a 201. */
export function settledOrThrow(sandbox: Sandbox): Sandbox {
  if (sandbox.state !== 'failed') return sandbox;
  const detail = `sandbox ${sandbox.id} failed (${sandbox.failureReason})${sandbox.detail ? `: ${sandbox.detail}` : ''}`;
  switch (sandbox.failureReason) {
    case 'lost':
      throw new RollboxError('node_lost', detail, 1);
    case 'admission_exhausted':
      throw new RollboxError('admission_exhausted', detail, 5);
    case 'timeout':
      throw new RollboxError('timeout', detail, 5);
    default:
      throw new RollboxError('internal', detail);
  }
}

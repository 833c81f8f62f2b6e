import { ZodError, type z } from 'zod';
import { Batch, FollowedRollout as FollowedRolloutData, JobRolloutTimes, Rollout, Trajectory, type CreateRolloutRequest } from '../api/index.ts';
import { BatchesClient } from './batches.ts';
import { json, serverSentEvents } from './body.ts';
import type { RollboxClient } from './client.ts';
import { RollboxApiError, networkMessage } from './errors.ts';

/**
 * One finished task of a followed batch: its result line, its rollout's trajectory (absent for
 * a task without an agent or one whose agent never started), and where to resume after it.
 */
export interface FollowedRollout extends FollowedRolloutData {
  /** Pass it as `after` to resume after this rollout (the line's cursor). */
  cursor: string;
}

const rolloutPath = (id: string, tail = '') => `/v1/rollouts/${encodeURIComponent(id)}${tail}`;

/**
 * Hosted rollouts from the trainer's side (scope rollout:submit): submit, read one, read its
 * trajectory, follow a batch's finished rollouts. A rollout runs as a batch task, so cancel it
 * with `BatchesClient.cancelBatch` on its batch.
 */
export class RolloutsClient {
  private readonly batches: BatchesClient;

  constructor(private readonly client: RollboxClient) {
    this.batches = new BatchesClient(client);
  }

  /** One rollout, run as a batch of one task: the answer is that batch (follow it with `followRollouts`). Retried only when refused (no idempotency key). */
  async submitRollout(request: z.input<typeof CreateRolloutRequest>): Promise<Batch> {
    return Batch.parse(await this.client.request('POST', '/v1/rollouts', { headers: { 'content-type': 'application/json' }, body: JSON.stringify(request), retry: 'refused' }, json));
  }

  /** A training job's ended rollouts by how they ended, and where their time went (sums, ms). */
  async jobRolloutTimes(job: string): Promise<JobRolloutTimes> {
    return JobRolloutTimes.parse(await this.client.request('GET', `/v1/jobs/${encodeURIComponent(job)}/rollout-times`, {}, json));
  }

  /** Where an attempt ran, its task's state in its batch, its model usage so far, where its time went once its agent exited. */
  async getRollout(id: string): Promise<Rollout> {
    return Rollout.parse(await this.client.request('GET', rolloutPath(id), {}, json));
  }

  /** Its model calls and task-sandbox commands, in the order they began. */
  async rolloutTrajectory(id: string): Promise<Trajectory> {
    return Trajectory.parse(await this.client.request('GET', rolloutPath(id, '/trajectory'), {}, json));
  }

  /**
   * The batch's finished tasks, in the order they ended, each with its rollout's trajectory,
   * until the batch has ended and every line is read. From `after` (a delivered one's
   * `cursor`): a trainer that keeps the cursor of the last rollout it took in gets each
   * rollout once across restarts. A line is yielded only once its trajectory is read, so
   * a follower stopped in between gets that rollout again from its last cursor.
   */
  async *followRollouts(batchId: string, options: { after?: string } = {}): AsyncGenerator<FollowedRollout> {
    for await (const line of this.batches.batchResults(batchId, { after: options.after, follow: true })) {
      const trajectory = line.rollout ? await this.rolloutTrajectory(line.rollout.id) : undefined;
      yield { line, ...(trajectory ? { trajectory } : {}), cursor: line.cursor };
    }
  }

  /**
   * The same as `followRollouts`, pushed by the server: the batch's events stream with
   * trajectories (`GET /v1/batches/:id/events?trajectory=true`), each rollout sent once its
   * trajectory was read. A dropped stream is resumed from the last cursor (Last-Event-ID), so
   * nothing is yielded twice or skipped; it ends with the batch. Reconnects back off, and
   * give up (`network`) after MAX_STREAM_DROPS drops in a row with no rollout between them;
   * an unknown batch (or another tenant's) is `not_found`, a token without the scope `forbidden`.
   */
  async *streamRollouts(batchId: string, options: { after?: string } = {}): AsyncGenerator<FollowedRollout> {
    let cursor = options.after;
    for (let drops = 1; ; drops++) {
      const headers: Record<string, string> = { accept: 'text/event-stream', ...(cursor ? { 'last-event-id': cursor } : {}) };
      // A refused or failed connect is retried by `request` itself; an error answer (not_found, forbidden) is thrown as it is.
      const body = await this.client.request('GET', `/v1/batches/${encodeURIComponent(batchId)}/events?trajectory=true`, { headers }, async (r) => r.body);
      if (!body) throw new RollboxApiError(502, 'internal', 'the batch events answered without a body');
      let cut: string;
      try {
        for await (const event of serverSentEvents(body)) {
          if (event.event === 'end') return;
          if (event.event !== 'rollout') continue;
          const followed = FollowedRolloutData.parse(JSON.parse(event.data));
          cursor = followed.line.cursor;
          drops = 1; // progress: the next drop starts its retries afresh
          yield { ...followed, cursor };
        }
        cut = 'the stream ended before its end event';
      } catch (err) {
        if (err instanceof SyntaxError || err instanceof ZodError) throw err;
        cut = networkMessage(err);
      }
      const error = new RollboxApiError(0, 'network', `the events of batch ${batchId} were cut ${drops} times in a row (${cut})`);
      if (drops >= MAX_STREAM_DROPS) throw error;
      await this.client.backoff(drops, error);
    }
  }
}

/** Drops of a rollouts stream in a row, with no rollout between them, before a follower gives up. */
const MAX_STREAM_DROPS = 6;

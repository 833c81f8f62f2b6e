import type { z } from 'zod';
import { Batch, BatchList, BatchResultLine, BatchTaskStatus, TERMINAL_BATCH_STATES, type BatchState, type CreateBatchRequest } from '../api/index.ts';
import { json, streamOf } from './body.ts';
import type { RollboxClient } from './client.ts';

export const NDJSON_TYPE = 'application/x-ndjson';
/** How long one long-poll of a followed batch's results waits for a line (the API allows 60). */
const FOLLOW_WAIT_SECONDS = 30;

/** The options of an NDJSON submit (sent as query parameters); unset ones take the API's defaults. */
export interface BatchSubmitOptions {
  maxConcurrency?: number;
  maxAttempts?: number;
  completionWindowSeconds?: number;
  class?: 'latency' | 'besteffort';
  metadata?: Record<string, string>;
}

export interface BatchResultsOptions {
  /** Start after this cursor (a line's `cursor`); default: the first line. */
  after?: string;
  /** Long-poll until the batch has ended and every line is read; without it, stop at the last line there now. */
  follow?: boolean;
  /** Lines per request (the API's default and cap: 1000 / 10000). */
  limit?: number;
}

/**
 * Evaluation batches (scope batch:submit) over a RollboxClient, with its retries. A submit
 * carries no idempotency key, so it is retried only when the gateway refused it (429, 503):
 * after a dropped connection the batch may exist, and a second try would run it twice.
 * Reads, cancels and result pages are retried like every other call; a results page
 * retried after a drop asks again from the last cursor, so no line is lost or repeated.
 */
export class BatchesClient {
  constructor(private readonly client: RollboxClient) {}

  async submitBatch(request: z.input<typeof CreateBatchRequest>): Promise<Batch> {
    return Batch.parse(await this.client.request('POST', '/v1/batches', { headers: { 'content-type': 'application/json' }, body: JSON.stringify(request), retry: 'refused' }, json));
  }

  /**
   * Streams the tasks as NDJSON: the body's bytes, in chunks sent as they come (a file's read
   * stream, or strings each ending in a newline). Nothing is buffered whole; a bad line
   * fails the batch and the call throws `invalid_request` naming the line. A string body is
   * retried when refused; a stream can be sent only once.
   */
  async submitBatchNdjson(lines: AsyncIterable<string | Uint8Array> | ReadableStream<Uint8Array> | string, options: BatchSubmitOptions = {}): Promise<Batch> {
    const params = new URLSearchParams();
    for (const key of ['maxConcurrency', 'maxAttempts', 'completionWindowSeconds', 'class'] as const) if (options[key] !== undefined) params.set(key, String(options[key]));
    if (options.metadata) params.set('metadata', JSON.stringify(options.metadata));
    const body = typeof lines === 'string' || lines instanceof ReadableStream ? lines : streamOf(lines);
    const init = { headers: { 'content-type': NDJSON_TYPE }, body, retry: typeof lines === 'string' ? ('refused' as const) : ('never' as const) };
    return Batch.parse(await this.client.request('POST', `/v1/batches${params.size ? `?${params}` : ''}`, init, json));
  }

  async getBatch(id: string): Promise<Batch> {
    return Batch.parse(await this.client.request('GET', `/v1/batches/${encodeURIComponent(id)}`, {}, json));
  }

  /** The tenant's batches, newest first. */
  async listBatches(options: { limit?: number } = {}): Promise<Batch[]> {
    return BatchList.parse(await this.client.request('GET', `/v1/batches${options.limit ? `?limit=${options.limit}` : ''}`, {}, json)).batches;
  }

  /** Queued tasks end `cancelled` at once, running ones soon after (state `cancelling` until then); finished results stay. */
  async cancelBatch(id: string): Promise<Batch> {
    return Batch.parse(await this.client.request('POST', `/v1/batches/${encodeURIComponent(id)}/cancel`, {}, json));
  }

  /** Where one task stands: queued (with its position), running, or done (with its status). */
  async batchTask(id: string, customId: string): Promise<BatchTaskStatus> {
    return BatchTaskStatus.parse(await this.client.request('GET', `/v1/batches/${encodeURIComponent(id)}/tasks/${encodeURIComponent(customId)}`, {}, json));
  }

  /**
   * The batch's result lines (one per ended task, in the order they ended), paged with the
   * cursor. With `follow`, long-polls for new lines until the batch is terminal and a read
   * after the last cursor answers none: every line is then delivered, once.
   */
  async *batchResults(id: string, options: BatchResultsOptions = {}): AsyncGenerator<BatchResultLine> {
    let after = options.after;
    const limit = options.limit ?? 1000;
    for (;;) {
      const params = new URLSearchParams({ limit: String(limit), waitSeconds: String(options.follow ? FOLLOW_WAIT_SECONDS : 0) });
      if (after) params.set('after', after);
      const page = await this.client.request('GET', `/v1/batches/${encodeURIComponent(id)}/results?${params}`, { headers: { accept: NDJSON_TYPE } }, async (response) => ({
        text: await response.text(),
        state: response.headers.get('x-rollbox-batch-state') as BatchState | null,
      }));
      const lines = page.text.split('\n').filter((l) => l.trim() !== '');
      for (const text of lines) {
        const line = BatchResultLine.parse(JSON.parse(text));
        after = line.cursor;
        yield line;
      }
      if (!options.follow && lines.length < limit) return;
      // The state is read before the lines: terminal then, and no line after the cursor, is the end.
      if (lines.length === 0 && page.state && TERMINAL_BATCH_STATES.includes(page.state)) return;
    }
  }
}

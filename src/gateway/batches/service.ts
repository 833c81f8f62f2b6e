import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';
import type { Redis } from 'ioredis';
import { BatchTask, RollboxError, TERMINAL_BATCH_STATES, newId, type Batch, type BatchOptions, type BatchResultLine, type BatchTaskStatus, type CreateBatchRequest, type CreateRolloutRequest } from '../../api/index.ts';
import { requireScope, type Principal } from '../../iam/index.ts';
import type { BlockingPool } from '../../redis/index.ts';
import { keys, type BatchStore } from '../../registry/index.ts';
import type { BatchJobs } from './jobs.ts';

export interface BatchServiceDeps {
  store: BatchStore;
  /** The batches' BullMQ queues: a submit adds one job per task. */
  jobs: Pick<BatchJobs, 'prepare' | 'add' | 'drain' | 'position'>;
  blocking: BlockingPool;
  /** Tells this gateway's runner there is work (the others find it on their next tick). */
  kick: () => void;
  maxNdjsonBytes: number;
  /** Refuses (coded) unless every image the tasks name passed its check: for batches with `requireValidated` (src/image-checks). */
  requireValidated: (principal: Principal, tasks: readonly BatchTask[]) => Promise<void>;
}

/** Tasks stored per round trip while a submit is read. */
const CHUNK = 500;

export const isTerminalBatch = (b: Pick<Batch, 'state'>) => TERMINAL_BATCH_STATES.includes(b.state);

/**
 * Evaluation batches: submit (a JSON body, or NDJSON streamed line by line so tens of
 * thousands of tasks are never held at once), read, list, cancel, results (a cursor over
 * the result stream, optionally waiting for the next line). Scope `batch:submit`; a
 * tenant sees only its own batches.
 */
export class BatchService {
  constructor(private readonly deps: BatchServiceDeps) {}

  async submit(principal: Principal, request: CreateBatchRequest): Promise<Batch> {
    requireScope(principal, 'batch:submit');
    if (request.tasks.some((t) => t.agent)) requireScope(principal, 'rollout:submit');
    return this.submitTasks(principal, request);
  }

  /** `POST /v1/rollouts`: one hosted rollout, as a batch of one task (scope `rollout:submit`). */
  async submitRollout(principal: Principal, request: CreateRolloutRequest): Promise<Batch> {
    requireScope(principal, 'rollout:submit');
    const { task, ...options } = request;
    return this.submitTasks(principal, { ...options, tasks: [task] });
  }

  private async submitTasks(principal: Principal, request: CreateBatchRequest): Promise<Batch> {
    const seen = new Set<string>();
    for (const t of request.tasks) {
      if (seen.has(t.customId)) throw new RollboxError('invalid_request', `customId ${t.customId} appears twice in the batch`);
      seen.add(t.customId);
    }
    const { tasks, ...options } = request;
    if (options.requireValidated) await this.deps.requireValidated(principal, tasks);
    const id = newId('batch');
    await this.create(id, principal.tenant, options);
    for (let i = 0; i < tasks.length; i += CHUNK) await this.addTasks(id, tasks.slice(i, i + CHUNK), options);
    return this.started(id);
  }

  /**
   * NDJSON: one task per line, read as it arrives. The batch is `validating` meanwhile; a
   * line that is not a valid task (or repeats a customId) fails the batch, naming the line,
   * and none of its tasks runs.
   */
  async submitNdjson(principal: Principal, options: BatchOptions, body: Readable): Promise<Batch> {
    requireScope(principal, 'batch:submit');
    const id = newId('batch');
    const { store } = this.deps;
    await this.create(id, principal.tenant, options);
    let bytes = 0;
    let lineNo = 0;
    let chunk: BatchTask[] = [];
    const refuse = async (code: 'invalid_request' | 'payload_too_large' | 'forbidden' | 'invalid_state' | 'not_found', message: string): Promise<never> => {
      body.destroy();
      await store.fail(id, { code, message });
      throw new RollboxError(code, `batch ${id} failed: ${message}`);
    };
    const flush = async () => {
      if (options.requireValidated) {
        await this.deps.requireValidated(principal, chunk).catch((err: unknown) => (err instanceof RollboxError && (err.code === 'invalid_state' || err.code === 'not_found') ? refuse(err.code, err.message) : Promise.reject(err)));
      }
      const duplicate = await this.addTasks(id, chunk, options);
      chunk = [];
      if (duplicate) await refuse('invalid_request', `customId ${duplicate} appears twice`);
    };
    for await (const line of createInterface({ input: body, crlfDelay: Infinity })) {
      lineNo++;
      bytes += Buffer.byteLength(line) + 1;
      if (bytes > this.deps.maxNdjsonBytes) await refuse('payload_too_large', `the body is larger than ${this.deps.maxNdjsonBytes} bytes`);
      if (line.trim() === '') continue;
      let parsed: unknown;
      try {
        parsed = JSON.parse(line);
      } catch {
        await refuse('invalid_request', `line ${lineNo} is not JSON`);
      }
      const task = BatchTask.safeParse(parsed);
      if (!task.success) await refuse('invalid_request', `line ${lineNo}: ${task.error.issues.map((i) => `${i.path.join('.') || 'task'}: ${i.message}`).join('; ')}`);
      if (task.data!.agent && !principal.scopes.has('rollout:submit') && !principal.scopes.has('admin')) await refuse('forbidden', `line ${lineNo}: a task with an agent needs scope rollout:submit`);
      chunk.push(task.data!);
      if (chunk.length >= CHUNK) await flush();
    }
    if (chunk.length > 0) await flush();
    if ((await store.get(id))!.counts.total === 0) await refuse('invalid_request', 'the body has no task');
    return this.started(id);
  }

  private async create(id: string, tenant: string, options: BatchOptions): Promise<void> {
    await this.deps.store.create(id, tenant, options);
    await this.deps.jobs.prepare(id, options);
  }

  /**
   * Claims the chunk's customIds (atomically, per customId), then adds their jobs. Answers
   * a customId already in the batch: then no job of the chunk is added (and the batch fails).
   */
  private async addTasks(id: string, tasks: readonly BatchTask[], options: BatchOptions): Promise<string | undefined> {
    const duplicate = await this.deps.store.addTasks(id, tasks);
    if (duplicate === undefined) await this.deps.jobs.add(id, tasks, options);
    return duplicate;
  }

  private async started(id: string): Promise<Batch> {
    await this.deps.store.start(id);
    this.deps.kick();
    return (await this.deps.store.get(id))!;
  }

  async get(principal: Principal, id: string): Promise<Batch> {
    requireScope(principal, 'batch:submit', 'rollout:submit');
    return this.deps.store.getOwned(id, principal.tenant);
  }

  async list(principal: Principal, limit: number): Promise<Batch[]> {
    requireScope(principal, 'batch:submit', 'rollout:submit');
    return this.deps.store.list(principal.tenant, limit);
  }

  /** Queued tasks end `cancelled` now, running ones as soon as their runners see it; finished results stay. */
  async cancel(principal: Principal, id: string): Promise<Batch> {
    requireScope(principal, 'batch:submit', 'rollout:submit');
    await this.deps.store.getOwned(id, principal.tenant);
    await this.deps.store.cancel(id, 'cancelled', 'the batch was cancelled');
    // Its waiting jobs' tasks ended cancelled in the store: the jobs go too.
    await this.deps.jobs.drain(id);
    this.deps.kick();
    return this.deps.store.getOwned(id, principal.tenant);
  }

  async task(principal: Principal, id: string, customId: string): Promise<BatchTaskStatus> {
    requireScope(principal, 'batch:submit', 'rollout:submit');
    await this.deps.store.getOwned(id, principal.tenant);
    const status = await this.deps.store.taskStatus(id, customId);
    if (status.state !== 'queued') return status;
    const position = await this.deps.jobs.position(id, customId);
    return position === undefined ? status : { ...status, position };
  }

  /**
   * Result lines after `after`; with none yet and `waitMs`, waits (up to then) for the next
   * one or the batch's end. Answers the batch too, so a follower knows when it is done.
   */
  async results(principal: Principal, id: string, after: string | undefined, limit: number, waitMs: number): Promise<{ lines: BatchResultLine[]; batch: Batch }> {
    requireScope(principal, 'batch:submit', 'rollout:submit');
    const { store } = this.deps;
    const batch = await store.getOwned(id, principal.tenant);
    let lines = await store.results(id, after, limit);
    if (lines.length === 0 && waitMs > 0 && !isTerminalBatch(batch)) {
      await this.waitForLine(id, after, waitMs);
      lines = await store.results(id, after, limit);
    }
    if (lines.length === 0) return { lines, batch };
    // Read again after the lines, so its counts cover them. Should it have ended between the two
    // reads, its last lines are read again: a task's line and the batch's end are one script, so
    // an ended batch never comes with fewer lines than it has (an image check saw a missing one).
    const now = await store.getOwned(id, principal.tenant);
    if (isTerminalBatch(now) && !isTerminalBatch(batch) && lines.length < limit) lines = await store.results(id, after, limit);
    return { lines, batch: now };
  }

  /** Blocks on the result stream until a line after `after` arrives or waitMs pass. */
  async waitForLine(id: string, after: string | undefined, waitMs: number): Promise<void> {
    await this.deps.blocking.with((conn: Redis) => conn.xread('COUNT', 1, 'BLOCK', Math.max(1, Math.round(waitMs)), 'STREAMS', keys.batchResults(id), after ?? '0-0'));
  }
}

import { Queue, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import { JOB_KEY_PREFIX, jobQueueName } from './connection.ts';
import { JobWorkerWatchdog } from './watchdog.ts';

/**
 * Sandbox jobs (creates, `/v1/run` runs, hibernation wakes) on one BullMQ queue per worker
 * host: the gateway places (the seed's first step) and adds the job to the chosen node's
 * queue; that node's Worker takes jobs at its starting concurrency and decides admission
 * in the processor (the second step). A refusal is an answer on the gateway's reply
 * channel, not a failed job: the gateway places it again elsewhere, never retries it on
 * the same host. Exec, files, signals and pool claims stay on the direct path (inbox.ts).
 */
export function createQueueName(nodeId: string): string {
  return jobQueueName('create', `node-${nodeId}`);
}

/** What a create job carries: it is answered by request id, so that is its job id. */
export interface CreateJobData {
  requestId: string;
}

/** Kept for the queue view and for a look after the fact, bounded. */
const KEEP_COMPLETED = { age: 3600, count: 200 };
const KEEP_FAILED = { age: 24 * 3600, count: 1000 };
/** Each queue's event stream (read by queue views only): a short tail. */
const EVENTS_MAX_LEN = 500;
/**
 * A processor that throws (Redis unreachable mid-create, say) runs again: the create
 * handler is idempotent by the sandbox's state.
 */
const ATTEMPTS = 3;
const RETRY_DELAY_MS = 200;

/** The gateway's side: one Queue per node it has sent to, on one connection. */
export class CreateJobQueues {
  private readonly queues = new Map<string, Queue>();

  constructor(private readonly connection: Redis) {}

  /** Adds a create to a node's queue; a job id seen before is not added twice (BullMQ keeps the first). */
  async add<T extends CreateJobData>(nodeId: string, job: T): Promise<void> {
    await this.queue(nodeId).add('create', job, {
      jobId: job.requestId,
      attempts: ATTEMPTS,
      backoff: { type: 'fixed', delay: RETRY_DELAY_MS },
      removeOnComplete: KEEP_COMPLETED,
      removeOnFail: KEEP_FAILED,
    });
  }

  /** The queue of a node (made on first use). */
  queue(nodeId: string): Queue {
    let queue = this.queues.get(nodeId);
    if (!queue) {
      queue = new Queue(createQueueName(nodeId), { connection: this.connection, prefix: JOB_KEY_PREFIX, streams: { events: { maxLen: EVENTS_MAX_LEN } } });
      queue.on('error', () => undefined); // the connection's own listener reports it
      this.queues.set(nodeId, queue);
    }
    return queue;
  }

  /**
   * A lost node's queue goes: its creates were placed again by their gateways (each one
   * sees its node go silent), and no worker is left to take or recover its jobs.
   */
  async discard(nodeId: string): Promise<void> {
    const queue = this.queue(nodeId);
    this.queues.delete(nodeId);
    try {
      await queue.obliterate({ force: true });
    } finally {
      await queue.close();
    }
  }

  async close(): Promise<void> {
    await Promise.all([...this.queues.values()].map((q) => q.close()));
    this.queues.clear();
  }
}

export interface CreateJobConsumerOptions<T extends CreateJobData> {
  nodeId: string;
  /** Makes BullMQ's connection (see connectJobRedis); a restart after a stall makes a new one. */
  connect: () => Redis;
  /** Creates started at once (the host's starting concurrency). */
  concurrency: number;
  /**
   * How long a job's lock holds without renewal: a host that dies mid-create has its job
   * taken again by its successor after about this long. Tuned to the heartbeat timeout,
   * not BullMQ's 30 s.
   */
  lockMs: number;
  parse: (data: unknown) => T;
  handle: (job: T) => Promise<void>;
  onError: (err: unknown) => void;
  /** Watchdog interval (default 10 s). */
  watchdogMs?: number;
}

/** The worker host's side: a BullMQ Worker on its own node's queue, watched. */
export class CreateJobConsumer<T extends CreateJobData> {
  private worker: Worker | undefined;
  private connection: Redis | undefined;
  private running = 0;
  private startedCount = 0;
  private readonly watchdog: JobWorkerWatchdog;
  private queue: Queue | undefined;

  constructor(private readonly options: CreateJobConsumerOptions<T>) {
    this.watchdog = new JobWorkerWatchdog(
      {
        active: () => this.running,
        started: () => this.startedCount,
        waiting: () => this.queue!.getWaitingCount(),
        restart: () => this.restart(),
      },
      options.watchdogMs ?? 10_000,
      (waiting) => options.onError(new Error(`create worker of ${options.nodeId} fetched nothing while ${waiting} jobs waited: restarting it`)),
      options.onError,
    );
  }

  get busy(): number {
    return this.running;
  }

  start(): void {
    this.open();
    this.watchdog.start();
  }

  private open(): void {
    const { options } = this;
    this.connection = options.connect();
    const name = createQueueName(options.nodeId);
    this.queue = new Queue(name, { connection: this.connection, prefix: JOB_KEY_PREFIX });
    this.worker = new Worker(name, (job: Job) => this.process(job), {
      connection: this.connection,
      prefix: JOB_KEY_PREFIX,
      concurrency: options.concurrency,
      lockDuration: options.lockMs,
      stalledInterval: options.lockMs,
      // A create stalled that often (its host dying again and again) fails; its gateway has re-placed it long before.
      maxStalledCount: 3,
    });
    this.worker.on('error', (err) => options.onError(err));
  }

  private async process(job: Job): Promise<void> {
    this.running++;
    this.startedCount++;
    try {
      await this.options.handle(this.options.parse(job.data));
    } finally {
      this.running--;
    }
  }

  private async restart(): Promise<void> {
    await this.close(false);
    this.open();
  }

  private async close(force: boolean): Promise<void> {
    const { worker, queue, connection } = this;
    this.worker = this.queue = this.connection = undefined;
    await worker?.close(force).catch((err: unknown) => this.options.onError(err));
    await queue?.close().catch(() => undefined);
    await connection?.quit().catch(() => connection.disconnect());
  }

  /**
   * Stops taking jobs and gives those running up to `graceMs` to end. A process that
   * exits before they end leaves their locks to lapse: its successor takes them again
   * (stalled-job recovery), and the handler, idempotent, answers with what happened.
   */
  async stop(graceMs: number): Promise<void> {
    this.watchdog.stop();
    await this.worker?.pause(true).catch((err: unknown) => this.options.onError(err));
    for (const until = Date.now() + graceMs; this.running > 0 && Date.now() < until; ) await new Promise((r) => setTimeout(r, 50));
    await this.close(this.running > 0);
  }
}

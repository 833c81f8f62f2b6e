import { createHash } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { Queue, Worker, type Job } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { Build, BuildRequest, RollboxError, newId, type ErrorCode, type BuildContext, type BuildLogEvent, type BuildStepState, type Image, type LayerDigest } from '../api/index.ts';
import { readerOf, requireScope, type Principal } from '../iam/index.ts';
import { JOB_KEY_PREFIX, jobQueueName } from '../queues/jobs/index.ts';
import { keys, type ImageRegistry, type LayerRegistry } from '../registry/index.ts';
import { readContext, type BuildContextFiles } from './context.ts';
import { StepFailed, runBuild, type BuildEngineDeps } from './engine.ts';
import { dockerfileOf, planBuild } from './plan.ts';

export interface BuildServiceDeps {
  redis: Redis;
  /** BullMQ's own connection (connectJobRedis). */
  jobConnection: Redis;
  engine: BuildEngineDeps;
  images: Pick<ImageRegistry, 'get' | 'put'>;
  layers: Pick<LayerRegistry, 'get' | 'resolve'>;
  /** Builds this gateway runs at once (0: it runs none, others do). */
  slots: number;
  /** A running build's BullMQ lock: a gateway that dies has its builds taken over about this long later (from the steps cached). */
  lockMs: number;
  contextMaxBytes: number;
  contextTtlMs: number;
  /** Build records and logs are kept this long. */
  recordTtlMs: number;
  logger: Logger;
  now: () => number;
}

const QUEUE = jobQueueName('build', 'builds');
const MAX_CONTEXT_ENTRIES = 200_000;
/** A build taken over this often (its gateways kept dying) ends failed. */
const MAX_STALLS = 2;
const ERROR_MESSAGE_MAX = 2000;
/** Contexts this gateway parsed lately, kept so a build's request and its job (and the next rebuild) parse them once. */
const PARSED_CONTEXTS_MAX_BYTES = 64 * 1024 * 1024;
const PARSED_CONTEXT_KEEP_MS = 60_000;

/**
 * Image builds: the request is checked and planned at once (a bad Dockerfile is refused
 * naming its line), recorded `queued`, and run as a BullMQ job by whichever gateway has a
 * slot. A job whose gateway dies is taken again by another (BullMQ's stalled check) and
 * runs again from the start; the step cache makes every step that had ended a hit. The
 * image is stored once, when every step has a layer: a failed build stores nothing.
 */
export class BuildService {
  private readonly queue: Queue;
  private worker: Worker | undefined;
  private stopping = false;
  private readonly running = new Set<AbortController>();
  /** By tenant and digest, oldest first: contexts never change under their digest. */
  private readonly parsed = new Map<string, { files: BuildContextFiles; bytes: number; atMs: number }>();
  /** Wakes this gateway's followers of a build's log when a line is appended here. */
  private readonly appended = new EventEmitter().setMaxListeners(0);

  constructor(private readonly deps: BuildServiceDeps) {
    this.queue = new Queue(QUEUE, { connection: deps.jobConnection, prefix: JOB_KEY_PREFIX });
    this.queue.on('error', (err) => deps.logger.warn({ err: String(err) }, 'build queue error'));
  }

  start(): void {
    if (this.deps.slots <= 0) return;
    this.worker = new Worker(QUEUE, (job: Job<{ buildId: string }>) => this.process(job.data.buildId), {
      connection: this.deps.jobConnection,
      prefix: JOB_KEY_PREFIX,
      concurrency: this.deps.slots,
      lockDuration: this.deps.lockMs,
      stalledInterval: Math.max(500, Math.round(this.deps.lockMs / 2)),
      maxStalledCount: MAX_STALLS,
    });
    this.worker.on('error', (err) => this.deps.logger.warn({ err: String(err) }, 'build worker error'));
    this.worker.on('failed', (job, err) => {
      // Stalled too often (or a fault outside process): the record must still end.
      if (job) void this.finishFailed(job.data.buildId, { code: 'internal', message: err.message }).catch(() => undefined);
    });
  }

  /**
   * Stops taking builds and stops those running here between two steps, without ending
   * them: their jobs' locks lapse and another gateway takes them over (from the cache).
   */
  async stop(): Promise<void> {
    this.stopping = true;
    for (const c of this.running) c.abort(new RollboxError('unavailable', 'the gateway running the build is stopping'));
    await this.worker?.close(true).catch(() => undefined);
    await this.queue.close().catch(() => undefined);
  }

  /** `POST /v1/images/builds/contexts`: the tar checked whole and kept by its digest, for this tenant. */
  async putContext(principal: Principal, archive: Buffer): Promise<BuildContext> {
    requireScope(principal, 'image:build');
    if (archive.length > this.deps.contextMaxBytes) throw new RollboxError('payload_too_large', `a build context is at most ${this.deps.contextMaxBytes} bytes (ROLLBOX_BUILD_CONTEXT_MAX_BYTES)`);
    const files = await readContext(archive, { maxEntries: MAX_CONTEXT_ENTRIES });
    const context = `sha256:${createHash('sha256').update(archive).digest('hex')}` as LayerDigest;
    const key = keys.buildContext(principal.tenant, context);
    await this.deps.redis.multi().hset(key, 'tar', archive, 'entries', files.size).pexpire(key, this.deps.contextTtlMs).exec();
    this.keepParsed(`${principal.tenant}/${context}`, files, archive.length);
    return { context, sizeBytes: archive.length, entries: files.size };
  }

  /**
   * `GET /v1/images/builds/contexts/:digest`: a context this tenant uploaded and still has
   * (kept another ROLLBOX_BUILD_CONTEXT_TTL_MS from now), so a client sends the same bytes once.
   */
  async findContext(principal: Principal, digest: string): Promise<BuildContext> {
    requireScope(principal, 'image:build');
    const key = keys.buildContext(principal.tenant, digest);
    const [sizeBytes, entries, kept] = ((await this.deps.redis.multi().hstrlen(key, 'tar').hget(key, 'entries').pexpire(key, this.deps.contextTtlMs).exec()) ?? []).map(([, value]) => value);
    if (!kept || !Number(sizeBytes)) throw new RollboxError('not_found', `build context ${digest} not found: upload it`);
    return { context: digest as LayerDigest, sizeBytes: Number(sizeBytes), entries: Number(entries) };
  }

  /** `POST /v1/images/builds`: planned (refusals here), recorded, queued. */
  async request(principal: Principal, request: BuildRequest): Promise<Build> {
    requireScope(principal, 'image:build');
    const context = request.context ? await this.context(principal.tenant, request.context) : new Map<string, never>();
    const plan = planBuild(dockerfileOf(request, (name) => context.get(name)?.data?.toString('utf8')), request);
    if (await this.deps.layers.resolve(request.name, readerOf(principal)).then(() => true, () => false)) throw new RollboxError('conflict', `${request.name} is a layer's name; an image needs a name of its own`);
    const build: Build = { id: newId('bld'), tenant: principal.tenant, name: request.name, state: 'queued', createdAt: new Date(this.deps.now()).toISOString(), steps: plan.steps, stepsRun: 0, stepsCached: 0 };
    await this.deps.redis.set(keys.build(build.id), JSON.stringify({ build, request }), 'PX', this.deps.recordTtlMs);
    await this.queue.add('build', { buildId: build.id }, { jobId: build.id, attempts: 1, removeOnComplete: { count: 1000 }, removeOnFail: { count: 1000 } });
    return build;
  }

  async get(principal: Principal, id: string): Promise<Build> {
    const stored = await this.stored(id);
    if (!stored || (stored.build.tenant !== principal.tenant && !principal.scopes.has('admin'))) throw new RollboxError('not_found', `build ${id} not found`);
    return stored.build;
  }

  /** The build and its log after `after` (a seq). */
  async log(principal: Principal, id: string, after: number): Promise<{ build: Build; events: BuildLogEvent[] }> {
    const build = await this.get(principal, id);
    const raw = await this.deps.redis.lrange(keys.buildLog(id), after + 1, -1);
    return { build, events: raw.map((r) => JSON.parse(r) as BuildLogEvent) };
  }

  private async stored(id: string): Promise<{ build: Build; request: BuildRequest } | undefined> {
    const json = await this.deps.redis.get(keys.build(id));
    if (!json) return undefined;
    const parsed = JSON.parse(json) as { build: unknown; request: unknown };
    return { build: Build.parse(parsed.build), request: BuildRequest.parse(parsed.request) };
  }

  private async context(tenant: string, digest: string): Promise<BuildContextFiles> {
    const cacheKey = `${tenant}/${digest}`;
    const kept = this.parsed.get(cacheKey);
    if (kept && this.deps.now() - kept.atMs < PARSED_CONTEXT_KEEP_MS) return kept.files;
    const archive = await this.deps.redis.hgetBuffer(keys.buildContext(tenant, digest), 'tar');
    if (!archive) throw new RollboxError('not_found', `build context ${digest} not found (uploaded contexts are kept ${Math.round(this.deps.contextTtlMs / 60_000)} min): upload it again`);
    const files = await readContext(archive, { maxEntries: MAX_CONTEXT_ENTRIES });
    this.keepParsed(cacheKey, files, archive.length);
    return files;
  }

  private keepParsed(cacheKey: string, files: BuildContextFiles, bytes: number): void {
    this.parsed.delete(cacheKey);
    if (bytes > PARSED_CONTEXTS_MAX_BYTES) return;
    this.parsed.set(cacheKey, { files, bytes, atMs: this.deps.now() });
    let total = 0;
    for (const entry of this.parsed.values()) total += entry.bytes;
    for (const [key, entry] of this.parsed) {
      if (total <= PARSED_CONTEXTS_MAX_BYTES && this.deps.now() - entry.atMs < PARSED_CONTEXT_KEEP_MS) break;
      this.parsed.delete(key);
      total -= entry.bytes;
    }
  }

  private async save(build: Build, request: BuildRequest): Promise<void> {
    await this.deps.redis.set(keys.build(build.id), JSON.stringify({ build, request }), 'PX', this.deps.recordTtlMs);
  }

  private async append(id: string, event: Omit<BuildLogEvent, 'seq'>): Promise<void> {
    const key = keys.buildLog(id);
    const length = await this.deps.redis.llen(key);
    await this.deps.redis.multi().rpush(key, JSON.stringify({ seq: length, ...event })).pexpire(key, this.deps.recordTtlMs).exec();
    this.appended.emit(id);
  }

  /** Resolves when this gateway appends to the build's log, or after `ms` (another gateway may run it). */
  async nextAppend(id: string, ms: number): Promise<void> {
    await new Promise<void>((resolve) => {
      const wake = (): void => {
        clearTimeout(timer);
        this.appended.off(id, wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.appended.on(id, wake);
    });
  }

  private async finishFailed(id: string, error: { code: ErrorCode; message: string }, failedStep?: Build['failedStep']): Promise<void> {
    const stored = await this.stored(id);
    if (!stored || stored.build.state === 'ready' || stored.build.state === 'failed') return;
    const steps = stored.build.steps.map((s) => (s.state === 'running' ? { ...s, state: 'failed' as const } : s));
    const build: Build = { ...stored.build, steps, state: 'failed', finishedAt: new Date(this.deps.now()).toISOString(), error: { code: error.code, message: error.message.slice(0, ERROR_MESSAGE_MAX) }, ...(failedStep ? { failedStep } : {}) };
    await this.save(build, stored.request);
    if (failedStep) await this.append(id, { kind: 'output', text: failedStep.output });
    await this.append(id, { kind: 'end', state: 'failed', text: build.error!.message });
  }

  /** The job: runs the build to its one end (a build already ended is left as it is). */
  private async process(id: string): Promise<void> {
    const stored = await this.stored(id);
    if (!stored || stored.build.state === 'ready' || stored.build.state === 'failed') return;
    const { request } = stored;
    let build: Build = { ...stored.build, state: 'building', startedAt: new Date(this.deps.now()).toISOString(), steps: stored.build.steps.map((s) => ({ ...s, state: 'pending' })) };
    await this.save(build, request);
    const log = this.deps.logger.child({ build: id, image: request.name, tenant: build.tenant });
    const controller = new AbortController();
    this.running.add(controller);
    try {
      const context = request.context ? await this.context(build.tenant, request.context) : new Map();
      const plan = planBuild(dockerfileOf(request, (name) => context.get(name)?.data?.toString('utf8')), request);
      const report = async (index: number, state: BuildStepState, detail: { layer?: LayerDigest; durationMs?: number } = {}) => {
        build = { ...build, steps: build.steps.map((s, i) => (i === index ? { ...s, state, ...detail } : s)) };
        await this.save(build, request);
        await this.append(id, { kind: 'step', step: index, state, text: build.steps[index]?.text ?? '' });
      };
      const made = await runBuild(this.deps.engine, { id, tenant: build.tenant, request, plan, context, report, signal: controller.signal });
      const layers = await Promise.all(
        made.layers.map(async (l) => ({ ...l, sizeBytes: (await this.deps.layers.get(l.digest))?.sizeBytes ?? 0 })),
      );
      const digest = `sha256:${createHash('sha256').update(JSON.stringify({ layers: layers.map((l) => l.digest), config: made.config })).digest('hex')}`;
      const image: Image = { name: request.name, digest, platform: 'linux/amd64', layers, config: made.config, sizeBytes: layers.reduce((n, l) => n + l.sizeBytes, 0), createdAt: new Date(this.deps.now()).toISOString() };
      await this.deps.images.put(build.tenant, image);
      build = { ...build, state: 'ready', finishedAt: new Date(this.deps.now()).toISOString(), digest, stepsRun: made.stepsRun, stepsCached: made.stepsCached };
      await this.save(build, request);
      await this.append(id, { kind: 'end', state: 'ready', text: `image ${request.name} ${digest}` });
      log.info({ stepsRun: made.stepsRun, stepsCached: made.stepsCached }, 'image built');
    } catch (err) {
      if (this.stopping) {
        log.info({ err: String(err) }, 'image build left for another gateway (this one is stopping)');
      } else if (err instanceof StepFailed) {
        log.info({ line: err.line, exitCode: err.exitCode }, 'image build failed at a step');
        await this.finishFailed(id, { code: 'build_step_failed', message: err.message }, { line: err.line, text: err.text, exitCode: err.exitCode, output: err.output });
      } else {
        const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal' as const, message: err instanceof Error ? err.message : String(err) };
        log.warn({ code: error.code, reason: error.message }, 'image build failed');
        await this.finishFailed(id, error);
      }
    } finally {
      this.running.delete(controller);
    }
  }
}

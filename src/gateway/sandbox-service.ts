import { createHash, randomBytes } from 'node:crypto';
import type { Queue } from 'bullmq';
import type { Logger } from 'pino';
import {
  RollboxError,
  isTerminal,
  type CommandRecord,
  type CreateJob,
  type CreateSandboxRequest,
  type ExecRequest,
  type JobActionResult,
  type PauseRequest,
  type ExecResult,
  type ListSandboxesQuery,
  type NodeOp,
  type Reply,
  type Sandbox,
} from '../api/index.ts';
import type { Config } from '../config/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import { chooseNode, type NodeDirectory, type ReplyHub } from '../queues/index.ts';
import type { Redis } from 'ioredis';
import { readOutput, type CommandLog, type LayerRegistry, type SandboxRegistry } from '../registry/index.ts';
import type { GatewayMetrics } from './metrics.ts';

export interface QueueProvider {
  createQueue(nodeId: string): Queue;
  opsQueue(nodeId: string): Queue;
}

export interface SandboxServiceDeps {
  config: Pick<Config, 'placement' | 'quota'> & { node: Pick<Config['node'], 'lostAfterMs' | 'pool'> };
  redis: Redis;
  registry: SandboxRegistry;
  commands: CommandLog;
  layers: LayerRegistry;
  directory: NodeDirectory;
  replies: ReplyHub;
  queues: QueueProvider;
  metrics: Pick<GatewayMetrics, 'creates' | 'refusals' | 'execs'>;
  logger: Logger;
  now: () => number;
  random: () => number;
}

/** One server-sent event of a streaming exec: `stdout`, `stderr`, then `exit` (the result without output). */
export interface ExecEvent {
  event: 'stdout' | 'stderr' | 'exit';
  id: string;
  data: string;
}

/** Extra wait for an exec reply beyond the command's own timeout (queueing, kill, reply). */
const EXEC_REPLY_GRACE_MS = 30_000;
/** Lifecycle operations (destroy, pause, resume) take milliseconds; this bounds a lost reply. */
const DESTROY_REPLY_TIMEOUT_MS = 30_000;
const POLL_MS = 25;
/** How often a waiting create checks that its node is still heartbeating. */
const NODE_CHECK_MS = 500;

export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(10).toString('base64url').replace(/[-_]/g, '').toLowerCase().slice(0, 12).padEnd(12, '0')}`;
}

/** Sandbox operations behind the HTTP routes: placement, the create handshake, exec, delete. */
export class SandboxService {
  constructor(private readonly deps: SandboxServiceDeps) {}

  async create(principal: Principal, request: CreateSandboxRequest, idempotencyKey: string | undefined): Promise<{ sandbox: Sandbox; replayed: boolean }> {
    const { creates } = this.deps.metrics;
    try {
      const outcome = await this.createOnce(principal, request, idempotencyKey);
      creates.inc({ outcome: outcome.replayed ? 'replayed' : outcome.sandbox.state });
      return outcome;
    } catch (err) {
      creates.inc({ outcome: err instanceof RollboxError ? err.code : 'internal' });
      throw err;
    }
  }

  private async createOnce(principal: Principal, request: CreateSandboxRequest, idempotencyKey: string | undefined): Promise<{ sandbox: Sandbox; replayed: boolean }> {
    requireScope(principal, 'sandbox:create');
    const { registry, config, directory } = this.deps;
    const layerDigests = await this.deps.layers.resolveAll([request.image.base, ...request.image.layers]);
    const placement = { memoryMiB: request.resources.memoryMiB, cpuMillis: request.resources.cpuMillis, pool: config.node.pool, exclude: new Set<string>() };
    // A node that joined since the last snapshot refresh should not mean "no capacity".
    let node = this.place(placement) ?? (await directory.refresh().then(() => this.place(placement)));
    if (!node) throw new RollboxError('no_capacity', `no worker host in pool ${placement.pool} can take ${request.resources.memoryMiB} MiB now`, 5);

    const id = newId('sbx');
    const nowMs = this.deps.now();
    const record: Sandbox = { id, tenant: principal.tenant, state: 'pending', node, spec: request, layerDigests, createdAt: new Date(nowMs).toISOString(), oomKills: 0 };
    const requestHash = createHash('sha256').update(JSON.stringify(request)).digest('hex');
    const admitted = await registry.admit({
      record,
      maxLive: config.quota.maxLiveSandboxesPerTenant,
      idempotencyKey,
      requestHash,
      settleDeadlineMs: nowMs + 3 * config.placement.createTimeoutMs,
    });
    if (admitted.kind === 'quota') {
      throw new RollboxError('quota_exceeded', `tenant ${principal.tenant} has ${admitted.liveCount} live sandboxes, the limit is ${config.quota.maxLiveSandboxesPerTenant}`, 10);
    }
    if (admitted.kind === 'exists') {
      if (admitted.requestHash !== requestHash) throw new RollboxError('conflict', 'Idempotency-Key was already used with a different request body');
      return { sandbox: await this.waitSettled(admitted.sandboxId, principal.tenant), replayed: true };
    }

    // The create handshake: ask a node, re-place on refusal, give up after N refusals.
    for (let attempt = 0; ; attempt++) {
      directory.assume(node, id, placement);
      const requestId = `${id}.${attempt}`;
      const job: CreateJob = { sandboxId: id, attempt, requestId, replyTo: this.deps.replies.gatewayId };
      const targetNode = node;
      const reply = await this.awaitCreateReply(requestId, targetNode, () => this.deps.queues.createQueue(targetNode).add('create', job, { jobId: requestId })).catch((err: unknown) => err);
      if (reply instanceof RollboxError && reply.code === 'timeout') return { sandbox: settledOrThrow(await this.onCreateTimeout(id, principal.tenant)), replayed: false };
      if (reply instanceof Error) throw reply;
      const r = reply as Reply;
      if (r.kind === 'created') return { sandbox: await registry.getOwned(id, principal.tenant), replayed: false };
      if (r.kind === 'error') return { sandbox: settledOrThrow(await this.waitSettled(id, principal.tenant)), replayed: false };
      if (r.kind !== 'refused') throw new RollboxError('internal', `unexpected reply ${r.kind}`);

      directory.forget(r.nodeId, id);
      this.deps.metrics.refusals.inc({ node: r.nodeId });
      placement.exclude.add(r.nodeId);
      const next = attempt + 1 < config.placement.maxRefusals ? this.place(placement) : undefined;
      if (!next) {
        await registry.transition(id, 'failed', { from: ['pending'], failureReason: 'admission_exhausted', detail: `refused by ${[...placement.exclude].join(', ')}` });
        await registry.releaseIdempotencyKey(principal.tenant, idempotencyKey);
        throw new RollboxError('admission_exhausted', `no worker host admitted the sandbox after ${placement.exclude.size} refusals (last: ${r.reason})`, 5);
      }
      if (!(await registry.reassign(id, node, next))) return { sandbox: settledOrThrow(await this.waitSettled(id, principal.tenant)), replayed: false };
      node = next;
    }
  }

  /**
   * The node's reply to a create; a node that stops heartbeating while the request waits
   * counts as a refusal, so the request is placed elsewhere instead of waiting for the timeout.
   */
  private async awaitCreateReply(requestId: string, nodeId: string, send: () => Promise<unknown>): Promise<Reply> {
    const reply = this.request(requestId, this.deps.config.placement.createTimeoutMs, send);
    for (;;) {
      const settled = await Promise.race([reply, new Promise<undefined>((r) => setTimeout(r, NODE_CHECK_MS))]);
      if (settled) return settled;
      if (this.deps.directory.isSilent(nodeId, this.deps.config.node.lostAfterMs)) {
        this.deps.replies.cancel(requestId);
        return { kind: 'refused', requestId, nodeId, reason: `worker host ${nodeId} stopped heartbeating` };
      }
    }
  }

  private place(request: Parameters<typeof chooseNode>[1]): string | undefined {
    const { config, directory, random } = this.deps;
    return chooseNode(directory.candidates(), request, { choices: config.placement.choices, staleAfterMs: config.node.lostAfterMs, random })?.heartbeat.nodeId;
  }

  /** Registers for the reply first, then sends, so a fast reply cannot be missed. */
  private async request(requestId: string, timeoutMs: number, send: () => Promise<unknown>): Promise<Reply> {
    const reply = this.deps.replies.expect(requestId, timeoutMs);
    try {
      await send();
    } catch (err) {
      this.deps.replies.cancel(requestId);
      throw err;
    }
    return reply;
  }

  private async onCreateTimeout(id: string, tenant: string): Promise<Sandbox> {
    const failed = await this.deps.registry.transition(id, 'failed', { from: ['pending'], failureReason: 'timeout', detail: 'no worker host picked the request up in time' });
    if (failed.kind === 'ok') throw new RollboxError('timeout', `sandbox ${id} was not started within ${this.deps.config.placement.createTimeoutMs} ms`, 5);
    return this.waitSettled(id, tenant);
  }

  /** Waits until a sandbox has left pending/creating (another request is creating it). */
  private async waitSettled(id: string, tenant: string): Promise<Sandbox> {
    const deadline = this.deps.now() + this.deps.config.placement.createTimeoutMs * 2;
    for (;;) {
      const sandbox = await this.deps.registry.getOwned(id, tenant);
      if (sandbox.state !== 'pending' && sandbox.state !== 'creating') return sandbox;
      if (this.deps.now() > deadline) throw new RollboxError('timeout', `sandbox ${id} is still ${sandbox.state}`, 5);
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  async get(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandbox:read');
    return this.deps.registry.getOwned(id, principal.tenant);
  }

  async list(principal: Principal, query: ListSandboxesQuery): Promise<Sandbox[]> {
    requireScope(principal, 'sandbox:read');
    return this.deps.registry.list(principal.tenant, query);
  }

  /**
   * Runs a command once per commandId: a re-sent command returns the recorded result
   * (`replayed: true`), waits for the first attempt if it is still running, and answers
   * `result_unknown` if its host died meanwhile.
   */
  async exec(principal: Principal, id: string, request: ExecRequest): Promise<ExecResult> {
    const { execs } = this.deps.metrics;
    try {
      const result = await this.execOnce(principal, id, request);
      execs.inc({ outcome: result.replayed ? 'replayed' : result.timedOut ? 'timed_out' : 'finished' });
      return result;
    } catch (err) {
      execs.inc({ outcome: err instanceof RollboxError ? err.code : 'internal' });
      throw err;
    }
  }

  private async execOnce(principal: Principal, id: string, request: ExecRequest): Promise<ExecResult> {
    const deadlineMs = this.deps.now() + request.timeoutMs + EXEC_REPLY_GRACE_MS;
    const started = await this.startExec(principal, id, request, { stream: false });
    if (!started.reply) return this.awaitRecorded(id, started.commandId, deadlineMs, !started.launched);
    // The node's reply is the fast path. The command log is the truth: it also tells when the
    // node died (result unknown) or when the reply was lost in transit.
    const watch = { cancelled: false };
    const recorded = this.awaitRecorded(id, started.commandId, deadlineMs, false, { firstWaitMs: 1000, watch });
    try {
      const first = await Promise.race([started.reply.catch((err: unknown) => (err instanceof RollboxError && err.code === 'timeout' ? recorded : Promise.reject(err))), recorded]);
      if ('kind' in first) {
        if (first.kind === 'exec') return first.result;
        if (first.kind === 'error') throw toRollboxError(first.error);
        throw new RollboxError('internal', `unexpected reply ${first.kind}`);
      }
      return first;
    } finally {
      watch.cancelled = true;
      this.deps.replies.cancel(started.requestId);
      recorded.catch(() => {});
    }
  }

  /**
   * Records the command and sends it to its node, unless its commandId is known already
   * (then there is no `reply`: the command log has or will have the outcome).
   */
  private async startExec(
    principal: Principal,
    id: string,
    request: ExecRequest,
    options: { stream: boolean },
  ): Promise<{ commandId: string; requestId: string; launched: boolean; reply?: Promise<Reply> }> {
    requireScope(principal, 'sandbox:exec');
    const { commands } = this.deps;
    const sandbox = await this.deps.registry.getOwned(id, principal.tenant);
    const requestId = newId('req');
    const commandId = request.commandId ?? newId('cmd');
    if (request.commandId && (await commands.get(id, commandId))) return { commandId, requestId, launched: false };
    if (sandbox.state !== 'running') throw new RollboxError('invalid_state', `sandbox ${id} is ${sandbox.state}${sandbox.failureReason ? ` (${sandbox.failureReason})` : ''}, not running`);
    const op: NodeOp = {
      kind: 'exec',
      sandboxId: id,
      requestId,
      replyTo: this.deps.replies.gatewayId,
      commandId,
      argv: request.argv ?? ['/bin/sh', '-c', request.cmd!],
      stdin: request.stdin,
      env: request.env,
      cwd: request.cwd,
      timeoutMs: request.timeoutMs,
      stream: options.stream,
    };
    if ((await commands.claim({ sandboxId: id, commandId, argv: op.argv, node: sandbox.node!, requestId })) === 'exists') return { commandId, requestId, launched: false };
    const send = () => this.deps.queues.opsQueue(sandbox.node!).add('exec', op, { jobId: requestId });
    if (options.stream) {
      await send();
      return { commandId, requestId, launched: true };
    }
    return { commandId, requestId, launched: true, reply: this.request(requestId, request.timeoutMs + EXEC_REPLY_GRACE_MS, send) };
  }

  /**
   * A streaming exec: output chunks in order as the command produces them, then its
   * outcome. Re-sent with the same commandId (and the last event id seen), it continues
   * where the dropped connection stopped; the command runs once.
   */
  async *streamExec(principal: Principal, id: string, request: ExecRequest, lastEventId = '0'): AsyncGenerator<ExecEvent> {
    const { commandId, launched } = await this.startExec(principal, id, request, { stream: true });
    const deadlineMs = this.deps.now() + request.timeoutMs + EXEC_REPLY_GRACE_MS;
    let afterId = lastEventId;
    for (let idleMs = POLL_MS; ; ) {
      const chunks = await readOutput(this.deps.redis, id, commandId, afterId);
      for (const chunk of chunks) yield { event: chunk.stream, id: chunk.id, data: chunk.data };
      if (chunks.length > 0) {
        afterId = chunks.at(-1)!.id;
        idleMs = POLL_MS;
        continue;
      }
      const record = await this.deps.commands.get(id, commandId);
      if (record?.state === 'done' && record.result) {
        // The worker writes all output before it records the result: drain what is left.
        const rest = await readOutput(this.deps.redis, id, commandId, afterId, 100_000);
        for (const chunk of rest) yield { event: chunk.stream, id: chunk.id, data: chunk.data };
        if (afterId === '0' && rest.length === 0) {
          // Recorded by a buffered exec (nothing was streamed): send its output whole.
          if (record.result.stdout) yield { event: 'stdout', id: 'result-stdout', data: record.result.stdout };
          if (record.result.stderr) yield { event: 'stderr', id: 'result-stderr', data: record.result.stderr };
        }
        const { stdout: _o, stderr: _e, ...outcome } = record.result;
        yield { event: 'exit', id: 'exit', data: JSON.stringify({ ...outcome, replayed: !launched }) };
        return;
      }
      if (!record) throw new RollboxError('invalid_state', `command ${commandId} was refused before it started; send it again`);
      if (record.state === 'unknown') throw new RollboxError('result_unknown', `command ${commandId} was running when its worker host ${record.node} died or restarted`);
      if (this.deps.now() > deadlineMs) throw new RollboxError('timeout', `command ${commandId} is still ${record.state}`, 5);
      await new Promise((r) => setTimeout(r, idleMs));
      idleMs = Math.min(200, idleMs * 2);
    }
  }

  /** The recorded outcome of a command, waiting while it is queued or running. */
  private async awaitRecorded(
    sandboxId: string,
    commandId: string,
    deadlineMs: number,
    replayed = true,
    options: { firstWaitMs?: number; watch?: { cancelled: boolean } } = {},
  ): Promise<ExecResult> {
    if (options.firstWaitMs) await new Promise((r) => setTimeout(r, options.firstWaitMs));
    for (let waitMs = POLL_MS; !options.watch?.cancelled; waitMs = Math.min(500, waitMs * 2)) {
      const record: CommandRecord | undefined = await this.deps.commands.get(sandboxId, commandId);
      if (!record) throw new RollboxError('invalid_state', `command ${commandId} was refused before it started; send it again`);
      if (record.state === 'done' && record.result) return { ...record.result, replayed };
      if (record.state === 'unknown') {
        throw new RollboxError('result_unknown', `command ${commandId} was running when its worker host ${record.node} died or restarted; it may or may not have taken effect`);
      }
      if (this.deps.now() > deadlineMs) throw new RollboxError('timeout', `command ${commandId} is still ${record.state}`, 5);
      await new Promise((r) => setTimeout(r, waitMs));
    }
    throw new RollboxError('internal', 'stopped waiting');
  }

  async commandLog(principal: Principal, id: string, limit: number): Promise<CommandRecord[]> {
    requireScope(principal, 'sandbox:read');
    await this.deps.registry.getOwned(id, principal.tenant);
    return this.deps.commands.list(id, limit);
  }

  /** Freeze (`pause`) or thaw (`resume`) one sandbox. */
  async setPaused(principal: Principal, id: string, paused: boolean, mode: PauseRequest['mode'] = 'freeze'): Promise<Sandbox> {
    requireScope(principal, 'sandbox:exec');
    return (await this.freezeOne(await this.deps.registry.getOwned(id, principal.tenant), paused, mode)).sandbox;
  }

  /** Pause or resume every live sandbox of a training job, across all worker hosts at once. */
  async setJobPaused(principal: Principal, job: string, paused: boolean, mode: PauseRequest['mode'] = 'freeze'): Promise<JobActionResult> {
    requireScope(principal, 'sandbox:exec');
    const sandboxes = (await this.deps.registry.list(principal.tenant, { job, limit: 1000 })).filter((s) => !isTerminal(s.state));
    const results = await Promise.all(
      sandboxes.map(async (sandbox) => {
        try {
          const { sandbox: after, changed } = await this.freezeOne(sandbox, paused, mode);
          return { id: sandbox.id, node: sandbox.node, outcome: changed ? ('done' as const) : ('unchanged' as const), state: after.state };
        } catch (err) {
          const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: String(err) };
          return { id: sandbox.id, node: sandbox.node, outcome: 'failed' as const, state: sandbox.state, error };
        }
      }),
    );
    return { job, results };
  }

  private async freezeOne(sandbox: Sandbox, paused: boolean, mode: PauseRequest['mode']): Promise<{ sandbox: Sandbox; changed: boolean }> {
    if (mode === 'hibernate') throw new RollboxError('invalid_request', 'mode hibernate is not available yet; use freeze');
    const [from, to] = paused ? (['running', 'paused'] as const) : (['paused', 'running'] as const);
    if (sandbox.state === to) return { sandbox, changed: false };
    if (sandbox.state !== from) throw new RollboxError('invalid_state', `sandbox ${sandbox.id} is ${sandbox.state}, not ${from}`);
    const requestId = newId('req');
    const op: NodeOp = { kind: paused ? 'pause' : 'resume', sandboxId: sandbox.id, requestId, replyTo: this.deps.replies.gatewayId };
    const reply = await this.request(requestId, DESTROY_REPLY_TIMEOUT_MS, () => this.deps.queues.opsQueue(sandbox.node!).add(op.kind, op, { jobId: requestId }));
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    return { sandbox: await this.deps.registry.getOwned(sandbox.id, sandbox.tenant), changed: true };
  }

  async delete(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandbox:delete');
    const { registry } = this.deps;
    const sandbox = await registry.getOwned(id, principal.tenant);
    if (isTerminal(sandbox.state)) return sandbox;
    // Not started yet: end it here; the node's pending->creating move will then be refused.
    if ((await registry.transition(id, 'terminated', { from: ['pending'], detail: 'deleted before it started' })).kind === 'ok') return registry.getOwned(id, principal.tenant);
    const stopping = await registry.transition(id, 'stopping', { from: ['creating', 'running', 'paused', 'hibernated'] });
    if (stopping.kind === 'ok' && (stopping.from === 'creating' || stopping.from === 'hibernated')) {
      // A create in flight finishes the delete itself; a hibernated sandbox has nothing running.
      if (stopping.from === 'hibernated') await registry.transition(id, 'terminated', { from: ['stopping'] });
      return this.waitTerminal(id, principal.tenant);
    }
    const requestId = newId('req');
    const op: NodeOp = { kind: 'destroy', sandboxId: id, requestId, replyTo: this.deps.replies.gatewayId };
    // The node's reply is the fast path; the registry is the truth (a lost node's sandboxes
    // are ended by the janitor, and the node itself ends a sandbox it finds `stopping`).
    const reply = this.request(requestId, DESTROY_REPLY_TIMEOUT_MS, () => this.deps.queues.opsQueue(sandbox.node!).add('destroy', op, { jobId: requestId }));
    const first = await Promise.race([reply.catch(() => undefined), this.waitTerminal(id, principal.tenant)]);
    this.deps.replies.cancel(requestId);
    if (first && 'kind' in first && first.kind === 'error') throw toRollboxError(first.error);
    return this.waitTerminal(id, principal.tenant);
  }

  private async waitTerminal(id: string, tenant: string): Promise<Sandbox> {
    const deadline = this.deps.now() + DESTROY_REPLY_TIMEOUT_MS;
    for (;;) {
      const sandbox = await this.deps.registry.getOwned(id, tenant);
      if (isTerminal(sandbox.state) || this.deps.now() > deadline) return sandbox;
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }
}

/** A create that ended in a failure answers with an error naming it, not with a 201. */
function settledOrThrow(sandbox: Sandbox): Sandbox {
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

function toRollboxError(error: { code: string; message: string; retryAfterSeconds?: number }): RollboxError {
  const known = ['invalid_state', 'not_found', 'conflict', 'timeout', 'invalid_request', 'result_unknown'] as const;
  const code = (known as readonly string[]).includes(error.code) ? (error.code as (typeof known)[number]) : 'internal';
  return new RollboxError(code, error.message, error.retryAfterSeconds);
}

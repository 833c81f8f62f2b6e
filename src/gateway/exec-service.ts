import type { Redis } from 'ioredis';
import {
  DEFAULT_BACKGROUND_TIMEOUT_MS,
  DEFAULT_EXEC_TIMEOUT_MS,
  RollboxError,
  type CommandRecord,
  type CommandStatus,
  type ExecRequest,
  type ExecResult,
  type Reply,
} from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import { readOutput, type CommandLog, type SandboxRegistry } from '../registry/index.ts';
import { newId } from './ids.ts';
import type { GatewayMetrics } from './metrics.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';

export interface ExecServiceDeps {
  redis: Redis;
  registry: SandboxRegistry;
  commands: CommandLog;
  nodes: NodeRequests;
  metrics: Pick<GatewayMetrics, 'execs'>;
  now: () => number;
}

/** One server-sent event of a streaming exec: `stdout`, `stderr`, then `exit` (the result without output). */
export interface ExecEvent {
  event: 'stdout' | 'stderr' | 'exit';
  id: string;
  data: string;
}

/** Extra wait for an exec reply beyond the command's own timeout (queueing, kill, reply). */
const EXEC_REPLY_GRACE_MS = 30_000;
const POLL_MS = 25;

/** Commands in sandboxes, through the command log: buffered, streamed, replayed. */
export class ExecService {
  constructor(private readonly deps: ExecServiceDeps) {}

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
    const deadlineMs = this.deps.now() + timeoutOf(request) + EXEC_REPLY_GRACE_MS;
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
      this.deps.nodes.cancel(started.requestId);
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
    options: { stream: boolean; background?: boolean },
  ): Promise<{ commandId: string; requestId: string; launched: boolean; reply?: Promise<Reply> }> {
    requireScope(principal, 'sandbox:exec');
    const { commands } = this.deps;
    const sandbox = await this.deps.registry.getOwned(id, principal.tenant);
    const requestId = newId('req');
    const commandId = request.commandId ?? newId('cmd');
    if (request.commandId && (await commands.get(id, commandId))) return { commandId, requestId, launched: false };
    if (sandbox.state !== 'running') throw new RollboxError('invalid_state', `sandbox ${id} is ${sandbox.state}${sandbox.failureReason ? ` (${sandbox.failureReason})` : ''}, not running`);
    const op = {
      kind: 'exec' as const,
      sandboxId: id,
      requestId,
      commandId,
      argv: request.argv ?? ['/bin/sh', '-c', request.cmd!],
      stdin: request.stdin,
      env: request.env,
      cwd: request.cwd,
      timeoutMs: timeoutOf(request),
      stream: options.stream,
      background: options.background ?? false,
    };
    if ((await commands.claim({ sandboxId: id, commandId, argv: op.argv, node: sandbox.node!, requestId })) === 'exists') return { commandId, requestId, launched: false };
    if (options.stream) {
      await this.deps.nodes.postOp(sandbox.node!, op);
      return { commandId, requestId, launched: true };
    }
    return { commandId, requestId, launched: true, reply: this.deps.nodes.sendOp(sandbox.node!, op, timeoutOf(request) + EXEC_REPLY_GRACE_MS) };
  }

  /**
   * A streaming exec: output chunks in order as the command produces them, then its
   * outcome. Re-sent with the same commandId (and the last event id seen), it continues
   * where the dropped connection stopped; the command runs once.
   */
  async *streamExec(principal: Principal, id: string, request: ExecRequest, lastEventId = '0'): AsyncGenerator<ExecEvent> {
    const { commandId, launched } = await this.startExec(principal, id, request, { stream: true });
    const deadlineMs = this.deps.now() + timeoutOf(request) + EXEC_REPLY_GRACE_MS;
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

  /** A background command: started (or found by its commandId), answered at once. */
  async startBackground(principal: Principal, id: string, request: ExecRequest): Promise<CommandStatus> {
    const { commandId } = await this.startExec(principal, id, request, { stream: true, background: true });
    // Whoever may start a command may see that it started: no sandbox:read needed here
    // (asking for it after the start would answer 403 for a command that runs).
    return this.statusOf(id, commandId);
  }

  /** A command's record with the output it has produced so far. */
  async commandStatus(principal: Principal, id: string, commandId: string): Promise<CommandStatus> {
    requireScope(principal, 'sandbox:read');
    await this.deps.registry.getOwned(id, principal.tenant);
    return this.statusOf(id, commandId);
  }

  private async statusOf(id: string, commandId: string): Promise<CommandStatus> {
    const record = await this.deps.commands.get(id, commandId);
    if (!record) throw new RollboxError('not_found', `command ${commandId} not found in sandbox ${id}`);
    if (record.result) return { ...record, stdout: record.result.stdout, stderr: record.result.stderr };
    const chunks = await readOutput(this.deps.redis, id, commandId, '0', 100_000);
    const joined = (stream: 'stdout' | 'stderr') => chunks.filter((c) => c.stream === stream).map((c) => c.data).join('');
    return { ...record, stdout: joined('stdout'), stderr: joined('stderr') };
  }

  async commandLog(principal: Principal, id: string, limit: number): Promise<CommandRecord[]> {
    requireScope(principal, 'sandbox:read');
    await this.deps.registry.getOwned(id, principal.tenant);
    return this.deps.commands.list(id, limit);
  }
}

function timeoutOf(request: ExecRequest): number {
  return request.timeoutMs ?? (request.background ? DEFAULT_BACKGROUND_TIMEOUT_MS : DEFAULT_EXEC_TIMEOUT_MS);
}

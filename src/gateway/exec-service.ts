import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import {
  DEFAULT_BACKGROUND_TIMEOUT_MS,
  DEFAULT_EXEC_TIMEOUT_MS,
  RollboxError,
  newId,
  SIGNAL_NUMBERS,
  type CommandInputResult,
  type CommandRecord,
  type CommandStdinRequest,
  type PtyRequest,
  type PtySize,
  type SignalName,
  type CommandStatus,
  type ExecRequest,
  type ExecResult,
  type Reply,
} from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import { followOutput, readOutput, type CommandLog, type CommandPage, type SandboxRegistry } from '../registry/index.ts';
import type { BlockingPool } from '../redis/index.ts';
import type { GatewayMetrics } from './metrics.ts';
import { sendToRunningCommand } from './command-input.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';
import { ptyExec } from './pty.ts';

export interface ExecServiceDeps {
  redis: Redis;
  /** Connections for blocking reads of output streams. */
  blocking: BlockingPool;
  registry: SandboxRegistry;
  commands: CommandLog;
  nodes: NodeRequests;
  metrics: Pick<GatewayMetrics, 'execs' | 'seen'>;
  now: () => number;
}

/** One server-sent event of a streaming exec: `stdout`, `stderr`, then `exit` (the result without output). */
export interface ExecEvent {
  event: 'stdout' | 'stderr' | 'exit';
  id: string;
  data: string;
}

/** Where the milliseconds of one request went, by hop (the gateway sends them as Server-Timing). */
export type HopTimer = (hop: string, ms: number) => void;

/** Extra wait for an exec reply beyond the command's own timeout (queueing, kill, reply). */
const EXEC_REPLY_GRACE_MS = 30_000;
/**
 * The reply comes by pub/sub, which can drop a message while a connection reconnects: this
 * often, a waiting exec also looks at the command's record. Never sooner: it is a safety
 * net, not a race with the reply.
 */
const RECORD_CHECK_MS = 5000;
/** A blocked read of an output stream wakes this often to look at the command's record. */
const FOLLOW_BLOCK_MS = 2000;
const POLL_MS = 25;

/** Commands in sandboxes, through the command log: buffered, streamed, replayed. */
export class ExecService {
  constructor(private readonly deps: ExecServiceDeps) {}

  /**
   * Runs a command once per commandId: a re-sent command returns the recorded result
   * (`replayed: true`), waits for the first attempt if it is still running, and answers
   * `result_unknown` if its host died meanwhile.
   */
  async exec(principal: Principal, id: string, request: ExecRequest, hop: HopTimer = () => {}): Promise<ExecResult> {
    const { execs } = this.deps.metrics;
    try {
      const result = await this.execOnce(principal, id, request, hop);
      execs.inc({ outcome: result.replayed ? 'replayed' : result.timedOut ? 'timed_out' : 'finished' });
      if (!result.replayed) this.deps.metrics.seen.execFinished(result.durationMs);
      return result;
    } catch (err) {
      execs.inc({ outcome: err instanceof RollboxError ? err.code : 'internal' });
      throw err;
    }
  }

  private async execOnce(principal: Principal, id: string, request: ExecRequest, hop: HopTimer): Promise<ExecResult> {
    const waitMs = timeoutOf(request) + EXEC_REPLY_GRACE_MS;
    const deadlineMs = this.deps.now() + waitMs;
    const started = await this.startExec(principal, id, request, { stream: false, waitMs }, hop);
    if (!started.reply) return this.awaitRecorded(id, started.commandId, deadlineMs);
    const sentAt = performance.now();
    const stopChecking = new AbortController();
    try {
      const reply = await Promise.race([started.reply, this.checkRecordEvery(id, started.commandId, stopChecking.signal)]);
      if ('commandId' in reply) return { ...reply, replayed: false };
      if (reply.kind === 'error') throw toRollboxError(reply.error);
      if (reply.kind !== 'exec') throw new RollboxError('internal', `unexpected reply ${reply.kind}`);
      const roundTripMs = performance.now() - sentAt;
      if (reply.workerMs !== undefined) {
        hop('dispatch', roundTripMs - reply.workerMs);
        hop('worker', reply.workerMs - reply.result.durationMs);
      }
      hop('run', reply.result.durationMs);
      return reply.result;
    } catch (err) {
      // No reply in time (or lost): the record decides.
      if (err instanceof RollboxError && err.code === 'timeout') return this.awaitRecorded(id, started.commandId, deadlineMs, false);
      throw err;
    } finally {
      stopChecking.abort();
      this.deps.nodes.cancel(started.requestId);
    }
  }

  /** The safety net under a reply that pub/sub may have lost: the record, every RECORD_CHECK_MS. */
  private async checkRecordEvery(sandboxId: string, commandId: string, signal: AbortSignal): Promise<Omit<ExecResult, 'replayed'>> {
    for (;;) {
      try {
        await sleep(RECORD_CHECK_MS, undefined, { signal, ref: false });
      } catch {
        return new Promise(() => {}); // the race is over: never settles, holds nothing
      }
      const record = await this.deps.commands.get(sandboxId, commandId);
      if (record?.state === 'done' && record.result) return record.result;
      if (record?.state === 'unknown') throw unknownError(record);
    }
  }

  /**
   * Records the command and sends it to its node in one step, unless its commandId is
   * known already (then there is no `reply`: the command log has or will have the outcome).
   */
  private async startExec(
    principal: Principal,
    id: string,
    request: ExecRequest,
    options: { stream: boolean; background?: boolean; waitMs?: number; pty?: PtySize },
    hop: HopTimer = () => {},
  ): Promise<{ commandId: string; requestId: string; launched: boolean; reply?: Promise<Reply> }> {
    requireScope(principal, 'sandbox:exec');
    const { commands, nodes } = this.deps;
    const requestId = newId('req');
    const commandId = request.commandId ?? newId('cmd');
    const op = nodes.addressed({
      kind: 'exec',
      sandboxId: id,
      requestId,
      commandId,
      argv: request.argv ?? ['/bin/sh', '-c', request.cmd!],
      stdin: request.stdin,
      env: request.env,
      cwd: request.cwd,
      user: request.user,
      timeoutMs: timeoutOf(request),
      stream: options.stream,
      background: options.background ?? false,
      ...(request.stdinOpen ? { stdinOpen: true } : {}),
      ...(options.pty ? { pty: options.pty } : {}),
    });
    // Listening before the op can reach the node: a fast reply cannot be missed.
    const reply = options.waitMs === undefined ? undefined : nodes.expect(requestId, options.waitMs);
    const t = performance.now();
    const claimed = await commands
      .claim({ sandboxId: id, tenant: principal.tenant, commandId, argv: op.kind === 'exec' ? op.argv : [], ...(options.pty ? { pty: options.pty } : {}), requestId, replyTo: nodes.gatewayId, op: JSON.stringify(op) })
      .finally(() => {
        // Lookup and claim are one round trip (the sandbox is checked inside the script).
        hop('claim', performance.now() - t);
      })
      .catch((err: unknown) => {
        nodes.cancel(requestId);
        throw err;
      });
    if (claimed.kind === 'claimed') return { commandId, requestId, launched: true, reply };
    nodes.cancel(requestId);
    reply?.catch(() => {});
    if (claimed.kind === 'exists') return { commandId, requestId, launched: false };
    if (claimed.kind === 'missing') throw new RollboxError('not_found', `sandbox ${id} not found`);
    const reason = claimed.failureReason ? ` (${claimed.failureReason})` : '';
    throw new RollboxError('invalid_state', `sandbox ${id} is ${claimed.state || 'unknown'}${reason}, not running`);
  }

  /**
   * A streaming exec: output chunks in order as the command produces them, then its
   * outcome. Re-sent with the same commandId (and the last event id seen), it continues
   * where the dropped connection stopped; the command runs once. The output stream is
   * followed with blocking reads, woken by each chunk and by the end marker.
   */
  async *streamExec(principal: Principal, id: string, request: ExecRequest, lastEventId = '0'): AsyncGenerator<ExecEvent> {
    const { commandId, launched } = await this.startExec(principal, id, request, { stream: true });
    yield* this.follow(id, commandId, { launched, lastEventId, deadlineMs: this.deps.now() + timeoutOf(request) + EXEC_REPLY_GRACE_MS });
  }

  /**
   * A command started with its output streamed (it runs once per commandId; `launched:
   * false` when it was known already), answered once it is recorded, with its events to follow.
   */
  async startStreaming(principal: Principal, id: string, request: ExecRequest, pty?: PtySize): Promise<{ commandId: string; launched: boolean; events: AsyncGenerator<ExecEvent> }> {
    const { commandId, launched } = await this.startExec(principal, id, request, { stream: true, ...(pty ? { pty } : {}) });
    return { commandId, launched, events: this.follow(id, commandId, { launched, lastEventId: '0', deadlineMs: this.deps.now() + timeoutOf(request) + EXEC_REPLY_GRACE_MS }) };
  }

  /** The output of a command started streaming (by anyone of the tenant), from `lastEventId` on, then its outcome. */
  async *followCommand(principal: Principal, id: string, commandId: string, options: { lastEventId?: string; timeoutMs: number; launched?: boolean }): AsyncGenerator<ExecEvent> {
    requireScope(principal, 'sandbox:read');
    await this.deps.registry.getOwned(id, principal.tenant);
    yield* this.follow(id, commandId, { launched: options.launched ?? false, lastEventId: options.lastEventId ?? '0', deadlineMs: this.deps.now() + options.timeoutMs + EXEC_REPLY_GRACE_MS });
  }

  private async *follow(id: string, commandId: string, options: { launched: boolean; lastEventId: string; deadlineMs: number }): AsyncGenerator<ExecEvent> {
    const { launched, deadlineMs } = options;
    let afterId = options.lastEventId;
    let streamed = afterId !== '0';
    for (;;) {
      const read = await this.deps.blocking.with((conn) => followOutput(conn, id, commandId, afterId, FOLLOW_BLOCK_MS));
      for (const chunk of read.chunks) yield { event: chunk.stream, id: chunk.id, data: chunk.data };
      if (read.lastId) {
        afterId = read.lastId;
        streamed ||= read.chunks.length > 0;
      }
      if (read.chunks.length > 0 && !read.ended) continue;
      const record = await this.deps.commands.get(id, commandId);
      if (record?.state === 'done' && record.result) {
        // The worker writes all output before it records the result: drain what is left
        // (nothing, when the end marker was read: it comes after the last chunk).
        const rest = read.ended ? { chunks: [] } : await readOutput(this.deps.redis, id, commandId, afterId, 100_000);
        for (const chunk of rest.chunks) yield { event: chunk.stream, id: chunk.id, data: chunk.data };
        if (!streamed && rest.chunks.length === 0) {
          // Recorded by a buffered exec (nothing was streamed): send its output whole.
          if (record.result.stdout) yield { event: 'stdout', id: 'result-stdout', data: record.result.stdout };
          if (record.result.stderr) yield { event: 'stderr', id: 'result-stderr', data: record.result.stderr };
        }
        const { stdout: _o, stderr: _e, ...outcome } = record.result;
        // Counted once, by the stream that started it (a follower's replay is not a new exec).
        if (launched) {
          this.deps.metrics.execs.inc({ outcome: outcome.timedOut ? 'timed_out' : 'finished' });
          this.deps.metrics.seen.execFinished(outcome.durationMs);
        }
        yield { event: 'exit', id: 'exit', data: JSON.stringify({ ...outcome, replayed: !launched }) };
        return;
      }
      if (!record) throw new RollboxError('invalid_state', `command ${commandId} was refused before it started; send it again`);
      if (record.state === 'unknown') throw unknownError(record);
      if (this.deps.now() > deadlineMs) throw new RollboxError('timeout', `command ${commandId} is still ${record.state}`, 5);
    }
  }

  /** The recorded outcome of a command, waiting while it is queued or running (a replay of a command still in flight). */
  private async awaitRecorded(sandboxId: string, commandId: string, deadlineMs: number, replayed = true): Promise<ExecResult> {
    for (let waitMs = POLL_MS; ; waitMs = Math.min(500, waitMs * 2)) {
      const record: CommandRecord | undefined = await this.deps.commands.get(sandboxId, commandId);
      if (!record) throw new RollboxError('invalid_state', `command ${commandId} was refused before it started; send it again`);
      if (record.state === 'done' && record.result) return { ...record.result, replayed };
      if (record.state === 'unknown') throw unknownError(record);
      if (this.deps.now() > deadlineMs) throw new RollboxError('timeout', `command ${commandId} is still ${record.state}`, 5);
      await new Promise((r) => setTimeout(r, waitMs));
    }
  }

  /** A background command: started (or found by its commandId), answered at once. */
  async startBackground(principal: Principal, id: string, request: ExecRequest): Promise<CommandStatus> {
    const { commandId } = await this.startExec(principal, id, request, { stream: true, background: true });
    // Whoever may start a command may see that it started: no sandbox:read needed here
    // (asking for it after the start would answer 403 for a command that runs).
    return this.statusOf(id, commandId);
  }

  /**
   * A command on a terminal (started, or found by its commandId), answered at once; its
   * output follows as its command's stream (followCommand), its input is its stdin.
   */
  async startPty(principal: Principal, id: string, request: PtyRequest): Promise<CommandStatus> {
    const { commandId } = await this.startExec(principal, id, ptyExec(request), { stream: true, background: true, pty: { cols: request.cols, rows: request.rows } });
    return this.statusOf(id, commandId);
  }

  /** A pty command started (once per commandId) with its output to follow, as streamExec. */
  async *streamPty(principal: Principal, id: string, request: PtyRequest, lastEventId = '0'): AsyncGenerator<ExecEvent> {
    const exec = ptyExec(request);
    const { commandId, launched } = await this.startExec(principal, id, exec, { stream: true, background: true, pty: { cols: request.cols, rows: request.rows } });
    yield* this.follow(id, commandId, { launched, lastEventId, deadlineMs: this.deps.now() + timeoutOf(exec) + EXEC_REPLY_GRACE_MS });
  }

  /** A running pty command's new window size (scope sandbox:exec). */
  async resizeCommand(principal: Principal, id: string, commandId: string, size: PtySize): Promise<CommandInputResult> {
    return sendToRunningCommand(this.deps, principal, id, { kind: 'resize', commandId, size });
  }

  /** A command's output after `afterId` as it stands now (no wait): a poller's page, the stream's last id its next cursor. */
  async commandOutput(principal: Principal, id: string, commandId: string, afterId: string): Promise<{ chunks: { stream: 'stdout' | 'stderr'; data: string }[]; lastId: string }> {
    requireScope(principal, 'sandbox:read');
    await this.deps.registry.getOwned(id, principal.tenant);
    const read = await readOutput(this.deps.redis, id, commandId, afterId, 10_000);
    return { chunks: read.chunks, lastId: read.lastId || afterId };
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
    const { chunks } = await readOutput(this.deps.redis, id, commandId, '0', 100_000);
    const joined = (stream: 'stdout' | 'stderr') => chunks.filter((c) => c.stream === stream).map((c) => c.data).join('');
    return { ...record, stdout: joined('stdout'), stderr: joined('stderr') };
  }

  /** A signal to a running command's process group, by its id (scope sandbox:exec). */
  async signalCommand(principal: Principal, id: string, commandId: string, signal: SignalName): Promise<CommandInputResult> {
    return sendToRunningCommand(this.deps, principal, id, { kind: 'signal', commandId, signo: SIGNAL_NUMBERS[signal] });
  }

  /** Stdin for a running command started with `stdinOpen`; `eof` closes it (scope sandbox:exec). */
  async writeCommandStdin(principal: Principal, id: string, commandId: string, input: CommandStdinRequest): Promise<CommandInputResult> {
    return sendToRunningCommand(this.deps, principal, id, { kind: 'stdin', commandId, data: input.data, eof: input.eof });
  }

  async commandLog(principal: Principal, id: string, limit: number): Promise<CommandRecord[]> {
    return (await this.commandPage(principal, id, { limit })).commands;
  }

  /** A page of the command log (see CommandLog.page). */
  async commandPage(principal: Principal, id: string, page: { after?: string; limit: number }): Promise<CommandPage> {
    requireScope(principal, 'sandbox:read');
    await this.deps.registry.getOwned(id, principal.tenant);
    return this.deps.commands.page(id, page);
  }
}

function unknownError(record: CommandRecord): RollboxError {
  return new RollboxError('result_unknown', `command ${record.commandId} was running when its worker host ${record.node} died or restarted; it may or may not have taken effect`);
}

function timeoutOf(request: ExecRequest): number {
  return request.timeoutMs ?? (request.background ? DEFAULT_BACKGROUND_TIMEOUT_MS : DEFAULT_EXEC_TIMEOUT_MS);
}

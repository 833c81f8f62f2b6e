import { setTimeout as sleep } from 'node:timers/promises';
import { performance } from 'node:perf_hooks';
import { RollboxError, newId, type NodeOp, type PauseMode, type Reply } from '../api/index.ts';
import { ackInbox, type InboxReceipt } from '../queues/index.ts';
import { INTERACTIVE_FLUSH_MS, OutputWriter, keys } from '../registry/index.ts';
import { sandboxFilesMeta } from './files-meta.ts';
import { readSandboxFiles, writeSandboxFiles } from './files.ts';
import type { HostContext } from './host-context.ts';
import { InitLostError } from './init/index.ts';
import { packWritableLayer, storePacked } from './layer-packing.ts';
import { hibernate } from './hibernating.ts';
import { setPaused, swapOut } from './pausing.ts';
import { CommandReleasedError, type RuntimeExecOutcome } from './runtime/index.ts';

type ExecOp = Extract<NodeOp, { kind: 'exec' }>;

/** How long input waits for a command this host is still starting (a loaded host takes seconds). */
const STARTING_COMMAND_WAIT_MS = 10_000;

/** Clock differences between the worker's start record and the init's grace timer, with room to spare. */
const NEVER_RECEIVED_MARGIN_MS = 2000;

/** A terminal's output is flushed to its stream at once (a typed key waits for its echo); other output is coalesced. */
const flushMsOf = (op: ExecOp): number | undefined => (op.pty ? INTERACTIVE_FLUSH_MS : undefined);

function notRunning(op: { sandboxId: string; commandId: string }): RollboxError {
  return new RollboxError('invalid_state', `command ${op.commandId} is not running in sandbox ${op.sandboxId} (or was not started with stdinOpen)`);
}

/**
 * Operations on sandboxes this host runs, taken from its `ops` inbox: commands, file
 * transfers, pause/resume, hibernation, snapshots, stage changes, destroy. Each answers
 * its gateway on the reply channel, errors as the typed error they were.
 */
export class OpHandler {
  /** Stage changes of one sandbox apply in the order they arrived. */
  private readonly policyChanges = new Map<string, Promise<void>>();
  /** Commands this process runs or collects (sandbox/command): a redelivered message never attaches to one of them. */
  private readonly inFlight = new Set<string>();

  constructor(private readonly ctx: HostContext) {}

  async handle(op: NodeOp, receipt: InboxReceipt): Promise<void> {
    const { ctx } = this;
    const done = (): Promise<void> => ctx.reply(op.replyTo, { kind: 'done', requestId: op.requestId });
    try {
      switch (op.kind) {
        case 'exec':
          return await this.exec(op, receipt);
        case 'destroy':
          await ctx.removeLocal(op.sandboxId);
          await ctx.deps.registry.transition(op.sandboxId, 'terminated', { node: ctx.nodeId });
          return await done();
        case 'snapshot': {
          const stored = await packWritableLayer(ctx, op.sandboxId, op.requestId, op.exclude);
          return await ctx.reply(op.replyTo, { kind: 'snapshot', requestId: op.requestId, ...stored });
        }
        case 'fork_point':
          return await ctx.reply(op.replyTo, await this.forkPoint(op));
        case 'hibernate':
          await hibernate(ctx, op.sandboxId, op.requestId);
          return await done();
        case 'policy':
          await this.applyPolicy(op);
          return await done();
        case 'pause':
        case 'resume':
          if (op.kind === 'pause' && op.mode === 'swap') await swapOut(ctx, op.sandboxId);
          else await setPaused(ctx, op.sandboxId, op.kind === 'pause');
          return await done();
        case 'files_read':
          ctx.requireLocal(op.sandboxId);
          return await ctx.reply(op.replyTo, await readSandboxFiles(ctx.deps, op));
        case 'files_write':
          ctx.requireLocal(op.sandboxId);
          return await ctx.reply(op.replyTo, await writeSandboxFiles(ctx.deps, op));
        case 'signal':
          ctx.requireLocal(op.sandboxId);
          if (!(await this.whenLive(op, () => ctx.deps.runtime.signalCommand(op.sandboxId, op.commandId, op.signo)))) throw notRunning(op);
          return await done();
        case 'stdin':
          ctx.requireLocal(op.sandboxId);
          // Bytes written twice cannot be taken back: a host that dies after writing them must
          // not write them again when it takes the message anew. Lost instead, the caller is
          // told (no answer: timeout), never fed twice.
          await ackInbox(ctx.deps.redis, receipt);
          if (!(await this.whenLive(op, () => ctx.deps.runtime.writeCommandStdin(op.sandboxId, op.commandId, Buffer.from(op.data, 'utf8'), op.eof)))) throw notRunning(op);
          return await done();
        case 'resize':
          ctx.requireLocal(op.sandboxId);
          if (!(await this.whenLive(op, () => ctx.deps.runtime.resizeCommand(op.sandboxId, op.commandId, op.size)))) throw new RollboxError('invalid_state', `command ${op.commandId} is not a running pty command in sandbox ${op.sandboxId}`);
          return await done();
        case 'files_meta':
          ctx.requireLocal(op.sandboxId);
          return await ctx.reply(op.replyTo, await sandboxFilesMeta(ctx.deps.runtime, op));
        case 'ttl':
          await ctx.moveExpiry(op.sandboxId, Date.parse(op.expiresAt));
          return await done();
        case 'metrics':
          ctx.requireLocal(op.sandboxId);
          return await ctx.reply(op.replyTo, { kind: 'metrics', requestId: op.requestId, metrics: await ctx.deps.runtime.metrics(op.sandboxId) });
      }
    } catch (caught) {
      let err = caught;
      if (err instanceof InitLostError) {
        await ctx.checkAlive(op.sandboxId);
        err = new RollboxError('invalid_state', `sandbox ${op.sandboxId}: ${err.message}`);
      }
      const error = err instanceof RollboxError ? { code: err.code, message: err.message, ...(err.retryAfterSeconds !== undefined ? { retryAfterSeconds: err.retryAfterSeconds } : {}) } : { code: 'internal', message: err instanceof Error ? err.message : String(err) };
      await ctx.reply(op.replyTo, { kind: 'error', requestId: op.requestId, error });
    }
  }

  /**
   * One command, once: fenced by the command log (a redelivered op, or one whose command
   * already ran, does not run again); its result recorded, its inbox message acknowledged
   * and its gateway answered in one script. The command is durable in the init: should
   * this process die, the next one collects it (resume).
   */
  private async exec(op: ExecOp, receipt: InboxReceipt): Promise<void> {
    const { ctx } = this;
    const { commands } = ctx.deps;
    const takenAt = performance.now();
    if (!ctx.local.has(op.sandboxId)) {
      // A running one is not this host's to forget: it went with its sandbox (hibernated whole with it, then woken elsewhere).
      if ((await commands.get(op.sandboxId, op.commandId))?.state !== 'running') await commands.abandon(op.sandboxId, op.commandId);
      throw new RollboxError('invalid_state', `sandbox ${op.sandboxId} is not running on this node`);
    }
    if (!(await commands.start(op.sandboxId, op.commandId, op.requestId))) return this.resume(op, receipt);
    const output = op.stream ? new OutputWriter(ctx.deps.redis, op.sandboxId, op.commandId, undefined, flushMsOf(op)) : undefined;
    const key = `${op.sandboxId}/${op.commandId}`;
    this.inFlight.add(key);
    try {
      await this.collect(op, receipt, output, takenAt, (record) => this.spawn(op, output, record));
    } finally {
      this.inFlight.delete(key);
    }
  }

  /**
   * Input for a command: sent now, or, while this host is still starting that command, once the
   * runtime holds its channel, a bounded while. Starting includes its exec op not taken yet:
   * input sent right behind a background exec can be taken from the inbox first.
   */
  private async whenLive(op: { sandboxId: string; commandId: string }, send: () => Promise<boolean>): Promise<boolean> {
    for (const until = Date.now() + STARTING_COMMAND_WAIT_MS; ; await sleep(20)) {
      if (await send()) return true;
      if (Date.now() > until) return false;
      const starting = this.inFlight.has(`${op.sandboxId}/${op.commandId}`) || (await this.ctx.deps.commands.get(op.sandboxId, op.commandId))?.state === 'queued';
      if (!starting) return false;
    }
  }

  private spawn(op: ExecOp, output: OutputWriter | undefined, record: (outcome: RuntimeExecOutcome) => Promise<void>): Promise<RuntimeExecOutcome> {
    const { config, runtime } = this.ctx.deps;
    return runtime.exec(op.sandboxId, {
      argv: op.argv,
      stdin: op.stdin,
      env: op.env,
      cwd: op.cwd,
      user: op.user,
      timeoutMs: op.timeoutMs,
      outputCapBytes: config.execOutputCapBytes,
      onOutput: output && ((stream, chunk) => output.write(stream, chunk)),
      holdBackBesteffort: !op.background,
      keepStdinOpen: op.stdinOpen,
      durable: { commandId: op.commandId, graceMs: config.commandGraceMs },
      ...(op.pty ? { pty: op.pty } : {}),
      record,
    });
  }

  /**
   * A redelivered exec (this host restarted while it ran): the command kept running in
   * its init, which kept its output and exit status; collected here and finished in the
   * command log with its real result, the waiting gateway answered. Its output stream
   * goes on where the previous process stopped writing it.
   */
  private async resume(op: ExecOp, receipt: InboxReceipt): Promise<void> {
    const { ctx } = this;
    const { commands, runtime } = ctx.deps;
    const key = `${op.sandboxId}/${op.commandId}`;
    const record = await commands.get(op.sandboxId, op.commandId);
    if (record?.state !== 'running' || this.inFlight.has(key)) return;
    this.inFlight.add(key);
    try {
      const takenAt = performance.now();
      const startedAtMs = Date.parse(record.startedAt ?? '') || ctx.now();
      const output = op.stream ? await OutputWriter.resume(ctx.deps.redis, op.sandboxId, op.commandId, flushMsOf(op)) : undefined;
      const collected = await this.collect(op, receipt, output, takenAt, async (recordResult) =>
        runtime.attach(op.sandboxId, {
          commandId: op.commandId,
          timeoutMs: op.timeoutMs - (ctx.now() - startedAtMs),
          onOutput: output && ((stream, chunk) => output.write(stream, chunk)),
          // Its duration runs from its start, not from this attach.
          record: (outcome) => recordResult({ ...outcome, durationMs: ctx.now() - startedAtMs }),
        }),
      );
      if (collected) {
        ctx.log.info({ sandboxId: op.sandboxId, commandId: op.commandId }, 'collected a command that outlived the previous worker process');
      } else if (ctx.now() - startedAtMs < ctx.deps.config.commandGraceMs - NEVER_RECEIVED_MARGIN_MS) {
        // Unknown to the init within a grace of its start: its grace cannot have run out, a
        // lost status is kept for the grace, a collected one is recorded: the previous
        // process died before the spawn reached the init. It runs now, for the first time.
        ctx.log.info({ sandboxId: op.sandboxId, commandId: op.commandId }, 'a command the previous worker process never handed to the init: started now');
        await this.collect(op, receipt, output, takenAt, (record) => this.spawn(op, output, record));
      } else {
        await commands.markUnknown(op.sandboxId, op.commandId, `its worker host ${ctx.nodeId} restarted while it ran and its init no longer held it (its grace of ${ctx.deps.config.commandGraceMs} ms ran out)`);
      }
    } finally {
      this.inFlight.delete(key);
    }
  }

  /**
   * Runs (or attaches to) a command and records what it gave: output first, then the
   * result (with the reply, acknowledging the inbox message), then the stream's end
   * marker, so whoever sees the result finds all output. False: an attach found nothing.
   */
  private async collect(
    op: ExecOp,
    receipt: InboxReceipt,
    output: OutputWriter | undefined,
    takenAt: number,
    run: (record: (outcome: RuntimeExecOutcome) => Promise<void>) => Promise<RuntimeExecOutcome | undefined>,
  ): Promise<boolean> {
    const { ctx } = this;
    const { commands } = ctx.deps;
    const record = async (outcome: RuntimeExecOutcome): Promise<void> => {
      const { oomKills, ...reported } = outcome;
      if (oomKills > 0) await ctx.deps.registry.addOomKills(op.sandboxId, oomKills);
      const result = { ...reported, commandId: op.commandId };
      await output?.flush(true); // all of it: the command has ended
      const reply: Reply = { kind: 'exec', requestId: op.requestId, result: { ...result, replayed: false }, workerMs: performance.now() - takenAt };
      await commands.complete(op.sandboxId, result, { receipt, replyChannel: keys.replyChannel(op.replyTo), reply: JSON.stringify(reply) });
      receipt.acked = true;
    };
    const outcome = await run(record).catch(async (err: unknown) => {
      if (err instanceof CommandReleasedError) {
        // This process stops and leaves the command running: its message stays taken, so
        // the next start requeues it and collects the command (resume).
        receipt.acked = true;
        return 'released' as const;
      }
      await commands.markUnknown(op.sandboxId, op.commandId, err instanceof Error ? err.message : String(err));
      if (!(err instanceof InitLostError)) throw err;
      // The init went away under the command: whatever it did, no result can be trusted.
      await ctx.checkAlive(op.sandboxId);
      throw new RollboxError('result_unknown', `command ${op.commandId}: ${err.message}; it may or may not have taken effect`);
    });
    if (!outcome) return false;
    if (outcome === 'released') return true;
    await output?.end();
    // A killed command may mean the whole sandbox went down with it.
    if (outcome.exitCode >= 128 || outcome.oomKills > 0) await ctx.checkAlive(op.sandboxId);
    return true;
  }

  /** A task stage change: applied here first, then recorded so a wake or an adoption uses it. */
  private async applyPolicy(op: Extract<NodeOp, { kind: 'policy' }>): Promise<void> {
    const { ctx } = this;
    ctx.requireLocal(op.sandboxId);
    const previous = this.policyChanges.get(op.sandboxId) ?? Promise.resolve();
    const change = previous.catch(() => undefined).then(async () => {
      const policy = await ctx.deps.runtime.applyPolicy(op.sandboxId, { network: op.network, hiddenPaths: op.hiddenPaths });
      await ctx.deps.registry.patchSpec(op.sandboxId, policy);
    });
    this.policyChanges.set(op.sandboxId, change);
    try {
      await change;
    } finally {
      if (this.policyChanges.get(op.sandboxId) === change) this.policyChanges.delete(op.sandboxId);
    }
  }

  /**
   * The TTL of a sandbox that pauses at it: paused in `mode`, then ended at `pausedUntilMs`
   * (see HostContext.expire). A swap pause this host has no room for freezes instead: nobody
   * waits on the answer, and a frozen sandbox is still whole.
   */
  async pauseAtTtl(sandboxId: string, mode: PauseMode, pausedUntilMs: number): Promise<void> {
    if (mode === 'hibernate') {
      // Recorded first: hibernate() hands the janitor the TTL it finds on the record.
      await this.ctx.deps.registry.setExpiresAt(sandboxId, new Date(pausedUntilMs).toISOString());
      return hibernate(this.ctx, sandboxId, newId('req'));
    }
    if (mode === 'swap') {
      await swapOut(this.ctx, sandboxId).catch(async (err: unknown) => {
        if (!(err instanceof RollboxError && err.code === 'swap_unavailable')) throw err;
        this.ctx.log.warn({ sandboxId, err: err.message }, 'auto-pause: no swap room; the sandbox is frozen with its memory');
        await setPaused(this.ctx, sandboxId, true);
      });
    } else {
      await setPaused(this.ctx, sandboxId, true);
    }
    await this.ctx.moveExpiry(sandboxId, pausedUntilMs);
  }

  /** A fork's point in a sandbox of this host: made, packed into a layer (answered as a snapshot), removed, or saved whole. */
  private async forkPoint(op: Extract<NodeOp, { kind: 'fork_point' }>): Promise<Reply> {
    const { runtime } = this.ctx.deps;
    switch (op.action) {
      case 'make': {
        this.ctx.requireLocal(op.sandboxId);
        const made = await runtime.makeForkPoint(op.sandboxId, op.forkPointId);
        return { kind: 'fork_point', requestId: op.requestId, cloned: made !== undefined, ...(made ? { frozenMs: made.frozenMs } : {}) };
      }
      case 'pack':
        return { kind: 'snapshot', requestId: op.requestId, ...(await storePacked(this.ctx, op.requestId, (outPath) => runtime.packForkPoint(op.forkPointId, outPath))) };
      case 'remove':
        runtime.removeForkPoint(op.forkPointId);
        return { kind: 'done', requestId: op.requestId };
      case 'save': {
        // Processes and all (a microVM), into the layer store where any host can restore the children.
        this.ctx.requireLocal(op.sandboxId);
        if (!runtime.hibernatesWhole(op.sandboxId)) throw new RollboxError('tier_unsupported', `sandbox ${op.sandboxId} is not saved whole on this host: its tier forks files only (processes: false)`);
        const saved = await runtime.forkWhole(op.sandboxId, this.ctx.deps.forkImageDirOf(op.forkPointId), { nic: op.childrenNic === true });
        return { kind: 'fork_point', requestId: op.requestId, cloned: false, saved: true, frozenMs: saved.frozenMs, detachedCommands: saved.detachedCommands };
      }
    }
  }
}

import type { Logger } from 'pino';
import { isRedisUnavailable, whileRedisAway } from '../redis/index.ts';
import { RollboxError, httpStatusOf, type ErrorCode, type ModelAttempt, type ModelCallRecord, type ModelUpstream } from '../api/index.ts';
import { needsStrip, readBody, readStream, type AttemptEnd } from './attempt.ts';
import { scrub, secretsOf, type ModelBindings, type StoredBinding } from './bindings.ts';
import { coalesce, type CallEntry, type CallStore, type HoldReason } from './calls.ts';
import { TokenAcc, errorBody, errorOf, parsed, type Asked, type Json } from './dialects/index.ts';
import { CallFeed } from './feed.ts';
import { iso, recordOf, type Answer } from './record.ts';
import type { JobHolds } from './holds.ts';
import type { RolloutLimits } from './log.ts';
import { Overlap } from './overlap.ts';
import { sseDecoder, sseText } from './sse.ts';
import { UNAVAILABLE_STATUSES, readAll, type Upstreams } from './upstream.ts';
import type { CallSpec } from './call-spec.ts';

export interface RunnerDeps {
  calls: CallStore;
  holds: JobHolds;
  bindings: ModelBindings;
  limits: RolloutLimits;
  upstreams: Upstreams;
  config: { maxHoldMs: number; probeMs: number; maxReissues: number };
  logger: Logger;
  now: () => number;
  /** The record is durable (for the job's figures and metrics). */
  recorded(spec: CallSpec, record: ModelCallRecord, reissues: number): void;
}

/** Entries go to the call's Redis stream in batches this often (clients on other gateways read them there). */
const FLUSH_MS = 20;

/**
 * Runs one model call to its record, whatever its clients do (a client that leaves does
 * not cancel it upstream): waits in its job's line while held, goes up to an upstream
 * (the next one when one fails), relays its answer to the call's feed, re-issues it when
 * the answer is cut (hiding from the agent what it already has), and writes its record
 * with the end of the answer.
 */
export class CallRunner {
  readonly feed = new CallFeed();
  /** Set when another gateway took the call over (this one was too slow to renew): stop, record nothing. */
  lost = false;
  private pending: CallEntry[] = [];
  private flushTimer: NodeJS.Timeout | undefined;
  private chain: Promise<unknown> = Promise.resolve();
  private readonly attempts: ModelAttempt[] = [];
  private overlap = new Overlap();
  private readonly assembler;
  private tokens = new TokenAcc();
  private request: Json | null = null;
  private asked: Asked | undefined;
  private heldSinceMs: number | undefined;
  private heldMs = 0;
  private upstreamMs = 0;
  private reissues = 0;
  /** First in line (the gate said go or probe): leave once the request is sent (probe: once answered). */
  private inLine = false;
  private probing = false;
  private deadlineMs: number | undefined;
  private headSent = false;
  private secrets: string[] = [];
  private answer: Answer | undefined;
  private upstreamUsed: string | null = null;

  constructor(
    private readonly deps: RunnerDeps,
    readonly spec: CallSpec,
  ) {
    this.assembler = spec.dialect.assembler();
  }

  /** Runs the call; `prior`: what its stream already holds (another gateway ran it until it died). */
  async run(prior: readonly CallEntry[] = []): Promise<void> {
    const { spec, deps } = this;
    for (const entry of prior) this.replay(entry);
    if (spec.takeover) {
      this.reissues++;
      this.attempts.push({ upstream: null, startedAt: iso(spec.receivedAtMs), endedAt: iso(deps.now()), outcome: 'owner_lost', error: 'the gateway running the call stopped renewing its lease' });
    }
    try {
      for (;;) {
        if (!(await this.redisBound(() => deps.bindings.get(spec.tenant, spec.job)))) {
          await this.wait('unbound', deps.config.probeMs);
          continue;
        }
        // The line's answer is acted on at once (nothing awaited between it and the request), so a pause holds every call it did not already release.
        await this.redisBound(() => this.hold());
        const binding = deps.bindings.peek(spec.tenant, spec.job);
        if (!binding) continue;
        const end = await this.attempt(binding);
        if (this.lost) return this.abandon();
        if (end === 'unreachable') {
          this.held('unreachable');
          await this.redisBound(() => deps.holds.markDown(spec.tenant, spec.job));
          await this.wait('unreachable', this.probing ? deps.config.probeMs : 0);
          continue;
        }
        if (end.kind === 'done') break;
        if (end.kind === 'diverged') throw new RollboxError('model_upstream_failed', 'the re-issued answer did not repeat what the agent had already received (the upstream samples differently); the stream cannot be continued');
        if (++this.reissues > deps.config.maxReissues) throw new RollboxError('model_upstream_failed', `the answer was cut short ${this.reissues} times (${end.error})`);
      }
    } catch (err) {
      if (this.lost) return this.abandon();
      const e = err instanceof RollboxError ? err : isRedisUnavailable(err) ? new RollboxError('unavailable', `Redis is not available (${(err as Error).message})`) : new RollboxError('internal', (err as Error).message);
      if (e.code === 'internal') deps.logger.error({ err, callId: spec.callId }, 'model call failed');
      this.fail(e.code, e.message);
    } finally {
      if (this.inLine) await this.leaveLine(false);
    }
    await this.finish();
  }

  /** An entry another gateway had written (its clients, and this run's, have it). */
  private replay(entry: CallEntry): void {
    this.feed.push(entry);
    if (entry.t === 'head') this.headSent = entry.status < 300;
    if (entry.t === 'data' && this.headSent) sseDecoder((raw) => this.assembler.event(parsed(raw)))(entry.d);
  }

  /** Whether the call is held now (for the held-calls gauge). */
  get isHeld(): boolean {
    return this.heldSinceMs !== undefined;
  }

  /** Waits in the job's line until the call may go (at once when nothing holds the job). */
  private async hold(): Promise<void> {
    const { spec, deps } = this;
    if (this.heldSinceMs === undefined && !this.probing && (await deps.holds.free(spec.tenant, spec.job))) return;
    for (;;) {
      const answer = await deps.holds.gate(spec.tenant, spec.job, spec.callId, spec.receivedAtMs);
      this.probing = answer === 'probe';
      this.inLine = answer === 'go' || answer === 'probe';
      if (this.inLine) return;
      await this.wait(answer === 'paused' ? 'paused' : answer === 'down' ? 'unreachable' : 'queued', Math.max(50, deps.config.probeMs / 2));
    }
  }

  /** Held: the agents learn it once, then the call sleeps until its job changes (or `ms`), within its deadline. */
  private async wait(reason: HoldReason, ms: number): Promise<void> {
    if (this.lost) throw new Error('the call was taken over or its gateway stopped');
    this.held(reason);
    this.deadlineMs ??= Math.min(this.spec.receivedAtMs + this.deps.config.maxHoldMs, (await this.redisBound(() => this.deps.limits.deadlineOf(this.spec.rolloutId))) ?? Infinity);
    const left = this.deadlineMs - this.deps.now();
    if (left <= 0) throw new RollboxError('model_hold_expired', `the call was held (${reason}) past its bound of ${Math.round((this.deadlineMs - this.spec.receivedAtMs) / 1000)} s (ROLLBOX_MODEL_MAX_HOLD_MS or the rollout's wall time)`);
    await this.deps.holds.wait(this.spec.tenant, this.spec.job, Math.min(ms, left));
  }

  private held(reason: HoldReason): void {
    if (this.heldSinceMs !== undefined) return;
    this.heldSinceMs = this.deps.now();
    this.push({ t: 'held', reason });
  }

  private unheld(): void {
    if (this.heldSinceMs === undefined) return;
    this.heldMs += this.deps.now() - this.heldSinceMs;
    this.heldSinceMs = undefined;
  }

  /** One try: the binding's upstreams in turn until one answers. */
  private async attempt(binding: StoredBinding): Promise<AttemptEnd | 'unreachable'> {
    const { spec, deps } = this;
    const prepared = spec.dialect.prepare(spec.body, binding.tokenFields);
    this.request = prepared.upstream;
    this.asked = prepared.asked;
    this.secrets = secretsOf(binding);
    const strip = needsStrip(prepared.asked, prepared.upstream, spec.body);
    const body = JSON.stringify(prepared.upstream);
    for (const upstream of deps.upstreams.order(binding)) {
      const startedMs = deps.now();
      const note = (outcome: ModelAttempt['outcome'], extra: Partial<ModelAttempt> = {}) => {
        this.attempts.push({ upstream: upstream.baseUrl, startedAt: iso(startedMs), endedAt: iso(deps.now()), outcome, ...extra });
        // A failed try while held is held time already (counted by unheld()).
        if (outcome !== 'unreachable') this.upstreamMs += deps.now() - startedMs;
        else if (this.heldSinceMs === undefined) this.heldMs += deps.now() - startedMs;
      };
      let answer;
      try {
        const onSent = this.inLine && !this.probing ? () => void this.leaveLine(false) : undefined;
        answer = await deps.upstreams.request(upstream, binding, { method: 'POST', path: spec.dialect.path, body, headers: spec.forward, accept: spec.stream ? 'text/event-stream' : 'application/json', ...(onSent ? { onSent } : {}) });
      } catch (err) {
        this.down(upstream, () => note('unreachable', { error: scrub((err as Error).message, this.secrets) }));
        continue;
      }
      if (UNAVAILABLE_STATUSES.has(answer.status)) {
        answer.body.resume();
        this.down(upstream, () => note('unreachable', { status: answer.status }));
        continue;
      }
      if (this.lost) {
        answer.body.destroy();
        return { kind: 'cut', error: 'taken over' };
      }
      // An answer: the upstream is back for every held call of the job.
      deps.upstreams.markUp(upstream);
      this.unheld();
      if (this.probing) await this.leaveLine(true);
      this.upstreamUsed = upstream.baseUrl;
      this.tokens = new TokenAcc();
      if (answer.status >= 300) {
        const text = scrub(await readAll(answer.body).catch((err: Error) => err.message), this.secrets);
        note('error', { status: answer.status });
        const error = errorOf(text);
        // After a re-issue the stream had begun: the error is its last event.
        this.answer = this.headSent ? { status: answer.status, terminal: this.errorEvent(answer.status, error.code, error.message), outcome: 'upstream_error', error } : { status: answer.status, body: text, outcome: 'upstream_error', error };
        return { kind: 'done' };
      }
      const end = spec.stream ? await this.consumeStream(answer.body, strip) : await readBody(answer.body, spec.dialect, prepared.asked, strip, this.tokens);
      const delivered = this.overlap.mode === 'continue' ? this.overlap.deliveredChars() : undefined;
      note(end.kind === 'done' ? 'ok' : 'cut', { status: answer.status, ...(end.kind === 'cut' ? { error: end.error } : {}), ...(delivered !== undefined ? { deliveredChars: delivered } : {}) });
      if (end.kind === 'done') this.answer = { status: answer.status, outcome: 'ok', ...(end.body !== undefined ? { body: end.body } : {}), ...(end.json ? { json: end.json } : {}), ...(end.terminal !== undefined ? { terminal: end.terminal } : {}) };
      return end;
    }
    return 'unreachable';
  }

  /** A step that needs Redis, tried again while Redis is unavailable (a failover), within the call's longest hold. */
  private redisBound<T>(step: () => Promise<T>): Promise<T> {
    return whileRedisAway(step, { untilMs: this.deps.now() + this.deps.config.maxHoldMs, now: this.deps.now, stopped: () => this.lost, onWait: (err) => this.deps.logger.warn({ err: err.message, callId: this.spec.callId }, 'Redis unavailable; the model call waits') });
  }

  /** Out of the job's line: the next held call goes. */
  private async leaveLine(upstreamBack: boolean): Promise<void> {
    if (!this.inLine) return;
    this.inLine = false;
    this.probing = false;
    await this.deps.holds.leave(this.spec.tenant, this.spec.job, this.spec.callId, upstreamBack).catch((err: unknown) => this.deps.logger.warn({ err, callId: this.spec.callId }, 'held call could not leave its line'));
  }

  private down(upstream: ModelUpstream, note: () => void): void {
    this.deps.upstreams.markDown(upstream, this.deps.config.probeMs);
    note();
  }

  private consumeStream(body: Parameters<typeof readStream>[0], strip: boolean): Promise<AttemptEnd> {
    if (!this.headSent) {
      this.headSent = true;
      this.push({ t: 'head', status: 200, contentType: 'text/event-stream; charset=utf-8' });
    }
    // A re-issue: what the agent has (every event it was sent) is what the new answer must continue.
    if (this.feed.entries.some((e) => e.t === 'data')) {
      this.overlap = new Overlap();
      const learn = sseDecoder((raw) => this.spec.dialect.reconcile(parsed(raw), this.overlap));
      for (const entry of this.feed.entries) if (entry.t === 'data') learn(entry.d);
      this.overlap.beginContinue();
    }
    return readStream(body, { dialect: this.spec.dialect, asked: this.asked!, strip, tokens: this.tokens, overlap: this.overlap, assembler: this.assembler, sink: { deliver: (text) => this.push({ t: 'data', d: text }) } });
  }

  /** The call ends in an error of ours, in the API's shape: a status and body, or an error event in a stream already begun. */
  private fail(code: ErrorCode, message: string): void {
    const status = httpStatusOf(code);
    const error = { code, message };
    if (this.headSent) this.answer = { status, terminal: this.errorEvent(status, code, message), outcome: 'failed', error };
    else this.answer = { status, body: JSON.stringify(errorBody(this.spec.dialect.flavor, status, code, message)), outcome: 'failed', error };
  }

  private errorEvent(status: number, code: string, message: string): string {
    return sseText(this.spec.dialect.errorEvent(status, code, message, this.overlap.sequence));
  }

  /** Another gateway runs the call now: this run stops, and its clients' answers end (their retries join the new run). */
  abandon(): void {
    this.lost = true;
    this.feed.end();
  }

  private push(entry: CallEntry): void {
    if (this.lost) return;
    this.feed.push(entry);
    this.pending.push(entry);
    this.flushTimer ??= setTimeout(() => this.flush(), FLUSH_MS);
  }

  private flush(): Promise<unknown> {
    clearTimeout(this.flushTimer);
    this.flushTimer = undefined;
    const batch = coalesce(this.pending);
    this.pending = [];
    const { rolloutId, callId } = this.spec;
    this.chain = this.chain.then(() => this.deps.calls.append(rolloutId, callId, batch)).catch((err: unknown) => this.deps.logger.warn({ err, callId }, 'model call stream not written'));
    return this.chain;
  }

  /** The record, and the rest of the answer with it; the answer's end reaches clients only once the record is durable. */
  private async finish(): Promise<void> {
    const { spec, deps } = this;
    this.unheld();
    const answer = this.answer!;
    const tail: CallEntry[] = [];
    if (!this.headSent) tail.push({ t: 'head', status: answer.status, contentType: 'application/json' });
    if (answer.body !== undefined && !this.headSent) tail.push({ t: 'data', d: answer.body });
    if (answer.terminal !== undefined) tail.push({ t: 'data', d: answer.terminal });
    tail.push({ t: 'end' });
    const record = recordOf(spec, { answer, streamed: spec.stream && this.headSent, assembler: this.assembler, tokens: this.tokens, request: this.request, upstream: this.upstreamUsed, attempts: this.attempts, heldMs: this.heldMs, upstreamMs: this.upstreamMs, endedAtMs: deps.now() });
    // What is not in the call's stream yet goes with the record (one Redis call for a short answer), after what is on its way.
    clearTimeout(this.flushTimer);
    this.flushTimer = undefined;
    const rest = coalesce([...this.pending, ...tail]);
    this.pending = [];
    await this.chain;
    const done = await this.redisBound(() => deps.calls.finish(spec.rolloutId, spec.bodyHash, spec.callId, spec.owner, scrub(JSON.stringify(record), this.secrets), record.usage?.completionTokens ?? 0, rest)).catch((err: unknown) => {
      // Redis stayed away past the call's bound: its clients' answers end unfinished (their retries join it later), nothing is recorded.
      deps.logger.error({ err, callId: spec.callId }, 'model call record not written');
      return 'lost' as const;
    });
    if (done === 'lost') {
      this.abandon();
      return;
    }
    for (const entry of tail) this.feed.push(entry);
    this.feed.end();
    deps.recorded(spec, { ...record, seq: done.seq, retriesJoined: done.retriesJoined }, this.reissues);
  }
}

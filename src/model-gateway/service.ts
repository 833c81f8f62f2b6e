import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { RollboxError, newId, type ModelApi, type ModelBinding, type ModelBindingView, type ModelHoldState } from '../api/index.ts';
import type { Config } from '../config/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import type { BlockingPool } from '../redis/index.ts';
import { ModelBindings, bindingView, scrub, secretsOf, type StoredBinding } from './bindings.ts';
import { CallStore, type CallEntry } from './calls.ts';
import { DIALECTS, type Json } from './dialects/index.ts';
import { RemoteSource, type EntrySource } from './feed.ts';
import { JobHolds } from './holds.ts';
import { modelKeys } from './keys.ts';
import { JobFigures, ModelCallLog, RolloutLimits } from './log.ts';
import { createModelMetrics, type ModelMetrics } from './metrics.ts';
import { relay } from './relay.ts';
import type { CallSpec } from './call-spec.ts';
import { CallRunner, type RunnerDeps } from './runner.ts';
import { UNAVAILABLE_STATUSES, Upstreams, forwardedHeaders, readAll } from './upstream.ts';

/** How often a gateway adds the figures of the calls it recorded to its jobs' (the console's) figures. */
const FIGURES_FLUSH_MS = 1000;

export interface ModelGatewayDeps {
  redis: Redis;
  /** A connection for pub/sub alone (the job events). */
  subscriber: Redis;
  blocking: BlockingPool;
  config: Config['model'];
  gatewayId: string;
  logger: Logger;
  now?: () => number;
  /** Where its Prometheus figures go (the gateway's registry). */
  metricsRegistry?: Registry;
}

/**
 * The model gateway (docs/model-gateway.md): OpenAI- and Anthropic-shaped model calls of
 * hosted rollouts' agents, relayed to their job's upstreams, recorded once each (retries
 * join, on any gateway), held instead of failed while the job is paused or its upstreams
 * are away, and mended when an answer is cut.
 */
export class ModelGateway {
  readonly bindings: ModelBindings;
  readonly holds: JobHolds;
  readonly calls: CallStore;
  readonly log: ModelCallLog;
  readonly limits: RolloutLimits;
  readonly figures: JobFigures;
  private readonly upstreams: Upstreams;
  private readonly running = new Map<string, CallRunner>();
  private readonly metrics: ModelMetrics | undefined;
  private readonly runnerDeps: RunnerDeps;
  private renewTimer: NodeJS.Timeout | undefined;
  private figuresTimer: NodeJS.Timeout | undefined;
  private runs = 0;
  private readonly now: () => number;

  constructor(private readonly deps: ModelGatewayDeps) {
    const { redis, config } = deps;
    this.now = deps.now ?? Date.now;
    this.bindings = new ModelBindings(redis, this.now);
    this.holds = new JobHolds(redis, { leaseMs: config.leaseMs, now: this.now });
    this.calls = new CallStore(redis, { leaseMs: config.leaseMs, recordTtlSeconds: config.recordTtlSeconds, retryJoinSeconds: config.retryJoinSeconds, now: this.now });
    this.log = new ModelCallLog(redis);
    this.limits = new RolloutLimits(redis, config.recordTtlSeconds);
    this.figures = new JobFigures(redis);
    this.upstreams = new Upstreams({ connectTimeoutMs: config.connectTimeoutMs, idleTimeoutMs: config.maxHoldMs, now: this.now });
    this.metrics = deps.metricsRegistry && createModelMetrics(deps.metricsRegistry, () => this.heldNow());
    this.runnerDeps = {
      calls: this.calls,
      holds: this.holds,
      bindings: this.bindings,
      limits: this.limits,
      upstreams: this.upstreams,
      config,
      logger: deps.logger,
      now: this.now,
      recorded: (spec, record, reissues) => {
        this.metrics?.recorded(spec.tenant, record, reissues);
        this.figures.add(spec.tenant, spec.job, record, reissues);
      },
    };
  }

  async start(): Promise<void> {
    this.deps.subscriber.on('message', (channel: string, message: string) => {
      if (channel !== modelKeys.events) return;
      const [kind, ref = ''] = message.split(' ', 2);
      // A new binding also wakes the job's held calls (a new upstream may answer).
      if (kind === 'binding') this.bindings.invalidate(ref);
      this.holds.onEvent(ref);
    });
    await this.deps.subscriber.subscribe(modelKeys.events);
    this.renewTimer = setInterval(() => void this.renew(), Math.max(50, this.deps.config.leaseMs / 3)).unref();
    this.figuresTimer = setInterval(() => void this.flushFigures(), FIGURES_FLUSH_MS).unref();
  }

  private flushFigures(): Promise<void> {
    return this.figures.flush().catch((err: unknown) => this.deps.logger.warn({ err }, 'model figures not written'));
  }

  async stop(): Promise<void> {
    clearInterval(this.renewTimer);
    clearInterval(this.figuresTimer);
    for (const runner of this.running.values()) runner.abandon();
    await this.flushFigures();
    await this.deps.subscriber.quit().catch(() => {});
    this.upstreams.close();
  }

  /** A model call of a rollout's agent: joins the same call in flight, or starts one; the answer as the API gives it. */
  async call(principal: Principal, api: ModelApi, request: Request, prefixRolloutId?: string): Promise<Response> {
    const rollout = this.rolloutOf(principal, prefixRolloutId);
    const raw = await request.text();
    const body = parseBody(raw);
    const dialect = DIALECTS[api];
    const bodyHash = createHash('sha256').update(`${api}\n`).update(raw).digest('hex');
    const retry = Number(request.headers.get('x-stainless-retry-count') ?? '0') > 0;
    const owner = this.owner();
    const joined = await this.calls.join(rollout.id, bodyHash, newId('mc'), owner, retry);
    if (joined.kind === 'limit') throw new RollboxError('model_limit_exceeded', joined.hit === 'wall_time' ? `rollout ${rollout.id} is past its wall time` : `rollout ${rollout.id} reached its ${joined.hit === 'max_tokens' ? 'token' : 'model call'} limit`);
    const spec: CallSpec = { tenant: principal.tenant, job: rollout.job, rolloutId: rollout.id, callId: joined.callId, bodyHash, owner, turn: joined.turn, receivedAtMs: joined.receivedAtMs, dialect, stream: body.stream === true, body, forward: forwardedHeaders(request.headers) };
    const key = `${rollout.id}\n${bodyHash}`;
    let source: EntrySource;
    if (joined.kind === 'join') {
      const local = this.running.get(key);
      source = local && local.spec.callId === joined.callId ? local.feed.source() : this.remote(spec);
    } else source = (await this.runCall(spec, joined.kind === 'takeover')).feed.source();
    const { config } = this.deps;
    return relay(source, { dialect, stream: spec.stream, receivedAtMs: joined.receivedAtMs, keepaliveMs: config.keepaliveMs, earlyHeadersMs: config.earlyHeadersMs, headers: { 'x-rollbox-model-call': joined.callId, 'x-rollbox-turn': String(joined.turn) }, now: this.now });
  }

  /** `/v1/messages/count_tokens`: relayed (held while the upstreams are away), not recorded. */
  countTokens(principal: Principal, request: Request, prefixRolloutId?: string): Promise<Response> {
    const rollout = this.rolloutOf(principal, prefixRolloutId);
    return request.text().then((raw) => this.relayPlain(principal.tenant, rollout.job, 'POST', '/messages/count_tokens', raw, request.headers));
  }

  /** `GET /v1/models`: the binding's model list when it has one, else the upstream's. */
  async models(principal: Principal, request: Request, prefixRolloutId?: string): Promise<Response> {
    const rollout = this.rolloutOf(principal, prefixRolloutId);
    const binding = await this.bindings.get(principal.tenant, rollout.job);
    if (binding?.models) {
      const anthropic = request.headers.has('anthropic-version');
      const data = binding.models.map((id) => (anthropic ? { type: 'model', id, display_name: id, created_at: new Date(0).toISOString() } : { id, object: 'model', created: 0, owned_by: 'rollbox' }));
      return Response.json(anthropic ? { data, has_more: false, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null } : { object: 'list', data });
    }
    return this.relayPlain(principal.tenant, rollout.job, 'GET', '/models', undefined, request.headers);
  }

  async putBinding(principal: Principal, job: string, binding: ModelBinding): Promise<ModelBindingView> {
    requireScope(principal, 'rollout:submit');
    await this.bindings.put(principal.tenant, job, binding);
    return this.view(principal, job);
  }

  async view(principal: Principal, job: string): Promise<ModelBindingView> {
    requireScope(principal, 'rollout:submit');
    await this.flushFigures();
    const [binding, hold, figures] = await Promise.all([this.bindings.get(principal.tenant, job), this.holds.state(principal.tenant, job), this.figures.read(principal.tenant, job)]);
    return { job, binding: bindingView(binding), hold, figures };
  }

  async deleteBinding(principal: Principal, job: string): Promise<ModelBindingView> {
    requireScope(principal, 'rollout:submit');
    if (!(await this.bindings.delete(principal.tenant, job))) throw new RollboxError('not_found', `job ${job} has no model binding`);
    return this.view(principal, job);
  }

  /** `POST /v1/jobs/:job/pause` and `/resume`: holds (or releases, in the order they came) the job's model calls. */
  setJobPaused(principal: Principal, job: string, paused: boolean): Promise<ModelHoldState> {
    if (!principal.scopes.has('rollout:submit')) requireScope(principal, 'sandbox:exec');
    return this.holds.pause(principal.tenant, job, paused);
  }

  private rolloutOf(principal: Principal, prefixRolloutId: string | undefined) {
    const rollout = principal.rollout;
    if (!rollout) throw new RollboxError('forbidden', 'model calls are made with a rollout key (rbr_...), which names the rollout they belong to');
    requireScope(principal, 'model:call');
    if (prefixRolloutId !== undefined && prefixRolloutId !== rollout.id) throw new RollboxError('not_found', `rollout ${prefixRolloutId} not found`);
    return rollout;
  }

  private owner(): string {
    return `${this.deps.gatewayId}.${++this.runs}`;
  }

  /** Runs a call here (a new one, or one taken over from a gateway that died: its stream so far is where the new run begins). */
  private async runCall(spec: CallSpec, takeover: boolean): Promise<CallRunner> {
    const prior = takeover ? await this.entriesOf(spec.rolloutId, spec.callId) : [];
    const runner = new CallRunner(this.runnerDeps, { ...spec, takeover });
    const key = `${spec.rolloutId}\n${spec.bodyHash}`;
    this.running.get(key)?.abandon();
    this.running.set(key, runner);
    void runner
      .run(prior)
      .catch((err: unknown) => this.deps.logger.error({ err, callId: spec.callId }, 'model call runner failed'))
      .finally(() => {
        if (this.running.get(key) === runner) this.running.delete(key);
      });
    return runner;
  }

  /** A call another gateway runs (or that ended): read from its Redis stream; taken over here if its owner dies. */
  private remote(spec: CallSpec): EntrySource {
    return new RemoteSource({
      calls: this.calls,
      blocking: this.deps.blocking,
      rolloutId: spec.rolloutId,
      callId: spec.callId,
      bodyHash: spec.bodyHash,
      leaseMs: this.deps.config.leaseMs,
      now: this.now,
      orphaned: async () => {
        const owner = this.owner();
        if (await this.calls.takeover(spec.rolloutId, spec.bodyHash, spec.callId, owner)) await this.runCall({ ...spec, owner }, true);
      },
    });
  }

  private async entriesOf(rolloutId: string, callId: string): Promise<CallEntry[]> {
    const entries: CallEntry[] = [];
    for (let after = '0'; ; ) {
      const rows = await this.calls.read(rolloutId, callId, after);
      for (const row of rows) entries.push(row.entry);
      if (rows.length < 500) return entries;
      after = rows.at(-1)!.id;
    }
  }

  /** Renews the leases of the calls this gateway runs; a call another gateway took over meanwhile is dropped here. */
  private async renew(): Promise<void> {
    await Promise.all(
      [...this.running.values()].map(async (runner) => {
        const { rolloutId, bodyHash, callId, owner } = runner.spec;
        const mine = await this.calls.renew(rolloutId, bodyHash, callId, owner).catch(() => true);
        if (!mine) runner.abandon();
      }),
    );
  }

  private heldNow() {
    const held = new Map<string, { tenant: string; job: string; count: number }>();
    for (const runner of this.running.values()) {
      if (!runner.isHeld) continue;
      const { tenant, job } = runner.spec;
      const entry = held.get(`${tenant}/${job}`) ?? { tenant, job, count: 0 };
      entry.count++;
      held.set(`${tenant}/${job}`, entry);
    }
    return held;
  }

  /** A request relayed as it is (not recorded), tried on each upstream, and again while none answers, within the longest hold. */
  private async relayPlain(tenant: string, job: string, method: 'GET' | 'POST', path: string, body: string | undefined, headers: Headers): Promise<Response> {
    const deadline = this.now() + this.deps.config.maxHoldMs;
    for (;;) {
      const binding: StoredBinding | null = await this.bindings.get(tenant, job);
      for (const upstream of binding ? this.upstreams.order(binding) : []) {
        const answer = await this.upstreams.request(upstream, binding!, { method, path, ...(body !== undefined ? { body } : {}), headers: forwardedHeaders(headers), accept: 'application/json' }).catch(() => undefined);
        if (!answer || UNAVAILABLE_STATUSES.has(answer.status)) {
          answer?.body.resume();
          continue;
        }
        const text = scrub(await readAll(answer.body).catch((err: Error) => err.message), secretsOf(binding));
        return new Response(text, { status: answer.status, headers: { 'content-type': answer.contentType || 'application/json' } });
      }
      if (this.now() >= deadline) throw new RollboxError('model_hold_expired', `no upstream of job ${job} answered ${method} ${path} within ROLLBOX_MODEL_MAX_HOLD_MS`);
      await this.holds.wait(tenant, job, this.deps.config.probeMs);
    }
  }
}

function parseBody(raw: string): Json {
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch {
    throw new RollboxError('invalid_request', 'body: not JSON');
  }
  if (!body || typeof body !== 'object' || Array.isArray(body)) throw new RollboxError('invalid_request', 'body: a JSON object is expected');
  return body as Json;
}

/**
 * The model gateway's Redis keys. A job's keys share the hash tag `{mjob:<tenant>/<job>}`
 * (its binding, hold state, queue of held calls, figures, rollout times), a rollout's share
 * `{rollout:<id>}` (its calls in flight, records, counters), so each script touches one
 * Redis Cluster slot.
 */
const part = (value: string) => encodeURIComponent(value);
const job = (tenant: string, name: string) => `rb:{mjob:${part(tenant)}/${part(name)}}`;
const rollout = (id: string) => `rb:{rollout:${part(id)}}:model`;

export const modelKeys = {
  /** The job's binding (JSON of ModelBindingParsed + updatedAt). */
  binding: (tenant: string, name: string) => `${job(tenant, name)}:binding`,
  /** Hash: paused (0/1), down (0/1). */
  holdState: (tenant: string, name: string) => `${job(tenant, name)}:hold`,
  /** ZSET of held calls, scored by arrival: they go up in this order. */
  holdQueue: (tenant: string, name: string) => `${job(tenant, name)}:queue`,
  /** ZSET of the same calls, scored by when their gateway's lease on them lapses. */
  holdLeases: (tenant: string, name: string) => `${job(tenant, name)}:leases`,
  /** Arrival numbers of the job's calls. */
  holdSeq: (tenant: string, name: string) => `${job(tenant, name)}:seq`,
  /** Hash of ModelFigures counters. */
  figures: (tenant: string, name: string) => `${job(tenant, name)}:figures`,
  /** Hash of the job's ended rollouts and their times (src/rollouts/job-times.ts). */
  rolloutTimes: (tenant: string, name: string) => `${job(tenant, name)}:rollout-times`,

  /** Turn numbers of the rollout's calls. */
  turns: (rolloutId: string) => `${rollout(rolloutId)}:turns`,
  /** Hash: a call in flight (or lately ended) by its body hash: callId, owner, leaseUntil, turn, state, ... */
  inflight: (rolloutId: string, bodyHash: string) => `${rollout(rolloutId)}:inflight:${bodyHash}`,
  /** A call's answer as its agents get it (a Redis stream): what a joining retry on any gateway reads. */
  output: (rolloutId: string, callId: string) => `${rollout(rolloutId)}:out:${callId}`,
  /** Hash callId -> ModelCallRecord JSON. */
  records: (rolloutId: string) => `${rollout(rolloutId)}:records`,
  /** ZSET callId by its log position (seq). */
  log: (rolloutId: string) => `${rollout(rolloutId)}:log`,
  /** Hash: limits (maxModelCalls, maxTokens, deadlineMs), use (calls, tokens, seq), hit. */
  usage: (rolloutId: string) => `${rollout(rolloutId)}:usage`,

  /** Pub/sub: `binding <tenant>/<job>` (its binding changed) or `hold <tenant>/<job>` (paused, resumed, its line moved). */
  events: 'rb:model-events',
  /** ZSET `<rolloutId> <bodyHash>` of calls in flight, scored by their lease's end: the sweeper's list. */
  running: 'rb:model-running',
} as const;

/** The `<tenant>/<job>` a job's events name. */
export const jobRef = (tenant: string, name: string) => `${tenant}/${name}`;

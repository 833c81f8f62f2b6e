import type { Redis } from 'ioredis';
import type { ModelHoldState } from '../api/index.ts';
import { LuaScript } from '../redis/index.ts';
import { jobRef, modelKeys } from './keys.ts';

const gateScript = new LuaScript(import.meta.dirname, 'gate');

export type GateAnswer = 'go' | 'probe' | 'paused' | 'queued' | 'down';

/** This gateway's copy of a job's hold state trusts itself this long (changes also come at once as events). */
const STATE_CACHE_MS = 1000;

interface CachedState {
  paused: boolean;
  down: boolean;
  queued: boolean;
  atMs: number;
}

/**
 * Holds of a job's model calls: while the job is paused (`POST /v1/jobs/:job/pause`, what
 * a preempted trainer says) or its upstreams do not answer, calls wait in one line per job
 * in Redis, in the order they came, whichever gateway holds them; when the job resumes or
 * an upstream answers again they go up in that order (one at a time: each leaves the
 * line once its request is sent, and the next sees it at once through the job's events,
 * so the upstream gets them in that order). While the upstreams are
 * down only the first in line tries them (every `probeMs`), so a dead upstream is not
 * hammered by every held call.
 */
export class JobHolds {
  private readonly cache = new Map<string, CachedState>();
  private readonly waiters = new Map<string, Set<() => void>>();

  constructor(
    private readonly redis: Redis,
    private readonly options: { leaseMs: number; now?: () => number },
  ) {}

  private get now(): number {
    return (this.options.now ?? Date.now)();
  }

  async pause(tenant: string, job: string, paused: boolean): Promise<ModelHoldState> {
    await this.redis.hset(modelKeys.holdState(tenant, job), 'paused', paused ? '1' : '0');
    await this.changed(tenant, job);
    return this.state(tenant, job);
  }

  async state(tenant: string, job: string): Promise<ModelHoldState> {
    const [[, flags], [, heldCalls]] = (await this.redis.multi().hmget(modelKeys.holdState(tenant, job), 'paused', 'down').zcard(modelKeys.holdQueue(tenant, job)).exec()) as [[null, (string | null)[]], [null, number]];
    return { paused: flags[0] === '1', upstreamDown: flags[1] === '1', heldCalls };
  }

  /** Whether a new call may go straight up (not paused, upstreams answering, nobody in line), from this gateway's copy. */
  async free(tenant: string, job: string): Promise<boolean> {
    const ref = jobRef(tenant, job);
    let state = this.cache.get(ref);
    if (!state || this.now - state.atMs > STATE_CACHE_MS) {
      const read = await this.state(tenant, job);
      state = { paused: read.paused, down: read.upstreamDown, queued: read.heldCalls > 0, atMs: this.now };
      if (this.cache.size > 10_000) this.cache.clear();
      this.cache.set(ref, state);
    }
    return !state.paused && !state.down && !state.queued;
  }

  /** Asks the line whether the call may go (it joins the line, or renews its place and lease in it). */
  async gate(tenant: string, job: string, callId: string, arrivalMs: number): Promise<GateAnswer> {
    const now = this.now;
    const [answer, left] = (await gateScript.run(this.redis, [modelKeys.holdState(tenant, job), modelKeys.holdQueue(tenant, job), modelKeys.holdLeases(tenant, job)], [callId, arrivalMs, now, now + this.options.leaseMs])) as [GateAnswer, number];
    this.cache.set(jobRef(tenant, job), { paused: answer === 'paused', down: answer === 'down' || answer === 'probe', queued: left > 0, atMs: now });
    return answer;
  }

  /** The call is out of the line (its request is sent, its probe answered, or it ended); `upstreamBack`: its probe got an answer. */
  async leave(tenant: string, job: string, callId: string, upstreamBack = false): Promise<void> {
    const multi = this.redis.multi().zrem(modelKeys.holdQueue(tenant, job), callId).zrem(modelKeys.holdLeases(tenant, job), callId);
    if (upstreamBack) multi.hset(modelKeys.holdState(tenant, job), 'down', '0');
    await multi.exec();
    await this.changed(tenant, job);
  }

  /** No upstream of the job answered: calls wait in line while the first one probes. */
  async markDown(tenant: string, job: string): Promise<void> {
    await this.redis.hset(modelKeys.holdState(tenant, job), 'down', '1');
    await this.changed(tenant, job);
  }

  /** Waits for a change of the job's holds (any gateway's), at most `ms`. */
  wait(tenant: string, job: string, ms: number): Promise<void> {
    const ref = jobRef(tenant, job);
    return new Promise((resolve) => {
      const set = this.waiters.get(ref) ?? new Set();
      this.waiters.set(ref, set);
      const done = () => {
        clearTimeout(timer);
        set.delete(done);
        if (set.size === 0) this.waiters.delete(ref);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, ms));
      set.add(done);
    });
  }

  /** A job's event (from any gateway): its copy is stale, its waiters look again. */
  onEvent(ref: string): void {
    this.cache.delete(ref);
    for (const wake of [...(this.waiters.get(ref) ?? [])]) wake();
  }

  private async changed(tenant: string, job: string): Promise<void> {
    this.cache.delete(jobRef(tenant, job));
    await this.redis.publish(modelKeys.events, `hold ${jobRef(tenant, job)}`);
  }
}

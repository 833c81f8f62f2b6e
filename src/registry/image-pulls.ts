import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { ImagePull, RollboxError } from '../api/index.ts';
import { LuaScript } from '../redis/index.ts';
import { keys } from './keys.ts';
import { parseRecord } from './record-check.ts';

const CLAIM = new LuaScript(import.meta.dirname, 'pull-claim');
const UPDATE = new LuaScript(import.meta.dirname, 'pull-update');

export type PullClaim = { outcome: 'started' | 'joined' | 'resumable' | 'conflict'; pull: ImagePull };

/**
 * Image pull records, shared by every gateway: one per name (its latest pull), with a
 * lease the running gateway renews. Every gateway meets a pull of a name here, so a second
 * request for it joins the running one, and a lapsed lease lets another gateway resume it.
 */
export class ImagePullRecords {
  constructor(
    private readonly redis: Redis,
    private readonly logger?: Pick<Logger, 'warn'>,
  ) {}

  /** A record that does not parse (an older version's) reads as none, and is logged: DELETE /v1/images/:name removes it. */
  async get(name: string): Promise<ImagePull | undefined> {
    const json = await this.redis.hget(keys.imagePulls, name);
    return json ? this.parsed(name, json) : undefined;
  }

  /** Whether a record (valid or not) is stored under the name. */
  async has(name: string): Promise<boolean> {
    return (await this.redis.hexists(keys.imagePulls, name)) === 1;
  }

  async all(): Promise<Map<string, ImagePull>> {
    const raw = await this.redis.hgetall(keys.imagePulls);
    return new Map(Object.entries(raw).flatMap(([name, json]) => {
      const pull = this.parsed(name, json);
      return pull ? [[name, pull] as const] : [];
    }));
  }

  private parsed(name: string, json: string): ImagePull | undefined {
    const parsed = parseRecord(ImagePull, json);
    if (!parsed.ok) this.logger?.warn({ image: name, issues: parsed.issues }, 'image pull record invalid: left out (DELETE /v1/images/:name removes it)');
    return parsed.ok ? parsed.value : undefined;
  }

  /** Names whose pull runs (or ran on a gateway that stopped), and whether a gateway holds each one's lease. */
  async active(): Promise<{ name: string; leased: boolean }[]> {
    const names = await this.redis.smembers(keys.imagePullsActive);
    if (names.length === 0) return [];
    const leased = await Promise.all(names.map((n) => this.redis.exists(keys.imagePullLease(n))));
    return names.map((name, i) => ({ name, leased: leased[i] === 1 }));
  }

  /** Starts a pull of `pull.ref` into the name, or joins or resumes the one running (see pull-claim.lua). */
  async claim(name: string, pull: ImagePull, token: string, leaseMs: number): Promise<PullClaim> {
    const [outcome, json] = (await CLAIM.run(this.redis, [keys.imagePulls, keys.imagePullLease(name), keys.imagePullsActive], [name, JSON.stringify(pull), token, leaseMs, pull.ref, pull.platform])) as [PullClaim['outcome'], string];
    const claimed = this.parsed(name, json);
    if (!claimed) throw new RollboxError('invalid_image', `the pull record of ${name} is invalid; DELETE /v1/images/${name} removes it`);
    return { outcome, pull: claimed };
  }

  /** Writes the record (and renews the lease, or gives it up when `ended`) while `token` holds it; false: the lease was lost. */
  async update(name: string, pull: ImagePull | undefined, token: string, leaseMs: number, options: { ended?: boolean; giveUp?: boolean } = {}): Promise<boolean> {
    const args = [name, pull ? JSON.stringify(pull) : '', token, leaseMs, options.ended ? '1' : '0', options.giveUp ? '1' : '0'];
    return (await UPDATE.run(this.redis, [keys.imagePulls, keys.imagePullLease(name), keys.imagePullsActive], args)) === 1;
  }

  /** Removes a name's record (an image deleted); a running pull is not: the caller checks. Answers whether there was one. */
  async delete(name: string): Promise<boolean> {
    return (await this.redis.hdel(keys.imagePulls, name)) === 1;
  }
}

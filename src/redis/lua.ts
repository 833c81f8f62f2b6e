import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { Redis } from 'ioredis';

/**
 * A Lua script kept in `<moduleDir>/lua/<name>.lua` (its header says its KEYS, ARGV and
 * answers), called by its SHA (EVALSHA): the body does not travel with every call. A
 * Redis that does not know it yet (first call, or restarted) answers NOSCRIPT and gets
 * the body once (EVAL), which also caches it there.
 *
 * Not ioredis's `defineCommand`: with `enableAutoPipelining` (on for every connection,
 * see connect.ts) its NOSCRIPT resend inside an automatic pipeline breaks the pipeline's
 * result list in ioredis 6 ("results[i] is not iterable"; seen in test/cluster.test.ts).
 *
 * Each state change of a sandbox or command is one such script, so concurrent gateways
 * and workers can never move a state backwards or end it twice. Its keys must share one
 * Redis Cluster slot: checked at every call, on one redis-server too, so a script whose
 * keys span slots fails in every test rather than only on a cluster.
 */
export class LuaScript {
  readonly body: string;
  readonly sha: string;

  constructor(
    moduleDir: string,
    readonly name: string,
  ) {
    this.body = readFileSync(path.join(moduleDir, 'lua', `${name}.lua`), 'utf8');
    this.sha = createHash('sha1').update(this.body).digest('hex');
  }

  async run(redis: Redis, keys: readonly string[], args: readonly (string | number | Buffer)[]): Promise<unknown> {
    const slot = keys.length ? hashedPart(keys[0]!) : '';
    const other = keys.find((key) => hashedPart(key) !== slot);
    if (other !== undefined) throw new Error(`Lua script ${this.name}: its keys ${JSON.stringify(keys[0])} and ${JSON.stringify(other)} are in different Redis Cluster slots (give them one hash tag)`);
    try {
      return await redis.evalsha(this.sha, keys.length, ...keys, ...args);
    } catch (err) {
      if (!String((err as Error).message).startsWith('NOSCRIPT')) throw err;
      return redis.eval(this.body, keys.length, ...keys, ...args);
    }
  }
}

/**
 * The part of a key Redis Cluster hashes to choose its slot: the hash tag (what is between
 * the first `{` and the next `}`, if not empty), else the whole key. Keys with the same
 * part share a slot.
 */
export function hashedPart(key: string): string {
  const open = key.indexOf('{');
  const close = open < 0 ? -1 : key.indexOf('}', open + 1);
  return close > open + 1 ? key.slice(open + 1, close) : key;
}

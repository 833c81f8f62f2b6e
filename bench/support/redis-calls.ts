import type { Redis } from 'ioredis';

/** Commands Redis has executed so far (INFO commandstats; commands inside scripts count too), INFO itself left out. */
export async function redisCallsSoFar(redis: Redis): Promise<number> {
  const text = await redis.info('commandstats');
  let total = 0;
  for (const m of text.matchAll(/^cmdstat_([a-z|_-]+):calls=(\d+)/gm)) if (m[1] !== 'info') total += Number(m[2]);
  return total;
}

/** Calls per second while nothing but the cluster's own background (heartbeats, janitor, controller) runs. */
export async function backgroundCallsPerSecond(redis: Redis, windowMs = 3000): Promise<number> {
  const before = await redisCallsSoFar(redis);
  const started = performance.now();
  await new Promise((r) => setTimeout(r, windowMs));
  return ((await redisCallsSoFar(redis)) - before) / ((performance.now() - started) / 1000);
}

/**
 * Redis calls one operation costs: `n` operations, one after another, minus the
 * background rate over the same time.
 */
export async function callsPerOperation(redis: Redis, n: number, op: () => Promise<unknown>): Promise<number> {
  const background = await backgroundCallsPerSecond(redis);
  const before = await redisCallsSoFar(redis);
  const started = performance.now();
  for (let i = 0; i < n; i++) await op();
  const seconds = (performance.now() - started) / 1000;
  const calls = (await redisCallsSoFar(redis)) - before - background * seconds;
  return Math.round((calls / n) * 10) / 10;
}

/** Commands Redis has executed so far, by command name (INFO commandstats; `evalsha`, and the commands scripts ran, each under its own name). */
export async function redisCallsByCommand(redis: Redis): Promise<Map<string, number>> {
  const text = await redis.info('commandstats');
  const calls = new Map<string, number>();
  for (const m of text.matchAll(/^cmdstat_([a-z|_-]+):calls=(\d+)/gm)) if (m[1] !== 'info') calls.set(m[1]!, Number(m[2]));
  return calls;
}

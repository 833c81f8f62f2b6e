import { Redis, type RedisOptions } from 'ioredis';

/**
 * One place that opens Redis connections, so every connection gets the same options.
 * `maxRetriesPerRequest: null` is what BullMQ requires of its blocking connections and
 * is harmless elsewhere: commands wait for a reconnect instead of failing at once.
 */
export function connectRedis(url: string, options: RedisOptions = {}): Redis {
  return new Redis(url, { maxRetriesPerRequest: null, enableAutoPipelining: true, ...options });
}

import { Redis, type RedisOptions } from 'ioredis';

/**
 * One place that opens Redis connections, so every connection gets the same options.
 * `maxRetriesPerRequest: null` is what BullMQ requires of its blocking connections and
 * is harmless elsewhere: commands wait for a reconnect instead of failing at once.
 * Connection errors go to `onError` (ioredis reconnects by itself); without a listener
 * ioredis would print every failed reconnect attempt.
 */
export function connectRedis(url: string, options: RedisOptions = {}, onError: (err: Error) => void = () => {}): Redis {
  const connection = new Redis(url, { maxRetriesPerRequest: null, enableAutoPipelining: true, ...options });
  connection.on('error', onError);
  return connection;
}

import type { Redis } from 'ioredis';
import { connectRedis } from '../../redis/index.ts';

/**
 * Every BullMQ key starts with this prefix. A queue's name carries the hash tag
 * (`create-{node:N}`, `batch-{batch:ID}`), so all keys of one queue share a Redis Cluster
 * slot while different queues spread over the shards.
 */
export const JOB_KEY_PREFIX = 'rb:jobs';

/** A queue name whose keys share one cluster slot: `kind-{tag}`. */
export function jobQueueName(kind: string, tag: string): string {
  if (/[{}:]/.test(tag)) throw new Error(`a queue tag cannot hold '{', '}' or ':' (got ${tag})`);
  return `${kind}-{${tag}}`;
}

/**
 * BullMQ's own connection: no auto-pipelining (BullMQ orders its own commands and its
 * blocking fetch must not queue behind others), and `maxRetriesPerRequest: null`, which
 * its workers require so a Redis restart makes commands wait instead of failing.
 * A `redis+cluster://` URL gives an ioredis Cluster, which BullMQ takes as it is (it reads
 * `maxRetriesPerRequest` from the cluster's per-node `redisOptions`, where connectRedis
 * puts it; test/redis-cluster.test.ts runs a job over one).
 */
export function connectJobRedis(url: string, onError: (err: Error) => void = () => {}): Redis {
  return connectRedis(url, { enableAutoPipelining: false, maxRetriesPerRequest: null }, onError);
}

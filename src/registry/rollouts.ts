import type { Redis } from 'ioredis';
import { RolloutRecord } from '../api/index.ts';
import { parseRecord } from './record-check.ts';

/** `{rollouts}`: one key per rollout attempt. */
const rolloutKey = (id: string) => `rb:{rollouts}:rollout:${id}`;

/**
 * Where a hosted rollout attempt ran, kept as long as its model calls are (its trajectory
 * reads both): whose it is, its job, its task and agent sandboxes.
 */
export class RolloutRecords {
  constructor(
    private readonly redis: Redis,
    private readonly ttlSeconds: number,
  ) {}

  async put(record: RolloutRecord): Promise<void> {
    await this.redis.set(rolloutKey(record.id), JSON.stringify(record), 'EX', this.ttlSeconds);
  }

  async get(id: string): Promise<RolloutRecord | undefined> {
    const json = await this.redis.get(rolloutKey(id));
    const parsed = json ? parseRecord(RolloutRecord, json) : undefined;
    return parsed?.ok ? parsed.value : undefined;
  }
}

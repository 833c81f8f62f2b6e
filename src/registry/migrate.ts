import type { Redis } from 'ioredis';
import { keys } from './keys.ts';

/** The key layout this code writes (2: hash tags, see keys.ts); kept in `rb:key-layout`. */
const KEY_LAYOUT = '2';
const LAYOUT_KEY = 'rb:key-layout';
const MIGRATION_LOCK_MS = 120_000;

/** Names before the hash tags -> names now. First match wins (the `:taken` inboxes before their lanes). */
const RENAMES: readonly [RegExp, (m: string[]) => string][] = [
  [/^rb:sbx:([^:]+)$/, (m) => keys.sandbox(m[1]!)],
  [/^rb:cmd:([^:]+):(.+)$/, (m) => keys.command(m[1]!, m[2]!)],
  [/^rb:out:([^:]+):(.+)$/, (m) => keys.commandOutput(m[1]!, m[2]!)],
  [/^rb:cmds:(.+)$/, (m) => keys.commandLog(m[1]!)],
  [/^rb:tenant:(.+):live$/, (m) => keys.tenantLive(m[1]!)],
  [/^rb:tenant:(.+):all$/, (m) => keys.tenantAll(m[1]!)],
  [/^rb:tenant:(.+):batches$/, (m) => keys.tenantBatches(m[1]!)],
  [/^rb:idem:([^:]+):(.+)$/, (m) => keys.idempotency(m[1]!, m[2]!)],
  [/^rb:idem-fork:([^:]+):(.+)$/, (m) => keys.forkIdempotency(m[1]!, m[2]!)],
  [/^rb:node:(.+):sbx$/, (m) => keys.nodeSandboxes(m[1]!)],
  [/^rb:node:(.+):stopping$/, (m) => keys.nodeStopping(m[1]!)],
  [/^rb:inbox:(.+):([a-z-]+):taken$/, (m) => `${keys.inbox(m[1]!, m[2]!)}:taken`],
  [/^rb:inbox:(.+):([a-z-]+)$/, (m) => keys.inbox(m[1]!, m[2]!)],
  [/^rb:pool:ready:([^:]+):([^:]+):(.+)$/, (m) => keys.poolReady(m[1]!, m[2]!, m[3]!)],
  [/^rb:pool:events:(.+)$/, (m) => keys.poolEvents(m[1]!)],
  [/^rb:batch:([^:]+)$/, (m) => keys.batch(m[1]!)],
  [/^rb:batch:([^:]+):(specs|running|attempts|done|sandboxes|results)$/, (m) => `${keys.batch(m[1]!)}:${m[2]!}`],
  [/^rb:layer:(.+)$/, (m) => keys.layer(m[1]!)],
  [/^rb:layers$/, () => keys.layers],
  [/^rb:layer-names$/, () => keys.layerNames],
  [/^rb:images$/, () => keys.images],
  [/^rb:image-diffids$/, () => keys.imageDiffIds],
  [/^rb:image-blobs$/, () => keys.imageBlobs],
  [/^rb:burst:fell-back$/, () => keys.burstFellBack],
  [/^rb:burst:fell-back-failed$/, () => keys.burstFellBackFailed],
  [/^rb:burst:policy$/, () => keys.burstPolicy],
  [/^rb:e2b-keys$/, () => 'rb:{e2b-keys}:index'],
  [/^rb:e2b-key:(.+)$/, (m) => `rb:{e2b-keys}:key:${m[1]!}`],
];

/** The new name of a key written before the hash tags, or undefined when it keeps its name. */
export function renamedKey(key: string): string | undefined {
  for (const [pattern, rename] of RENAMES) {
    const m = pattern.exec(key);
    if (m) return rename([...m]);
  }
  return undefined;
}

/**
 * Brings a Redis written by an earlier rollbox to the current key layout, once: every key
 * renamed to its hash-tagged name (RENAMENX: a key the new layout already has is kept),
 * each pool's definition moved into its slot, and sandboxes recorded before layer reference counts
 * existed counted. Run by every gateway and worker host at start; one does the work under
 * a lock and the others wait for the layout mark. A Redis Cluster skips it: a cluster is
 * new with this layout (and has no cluster-wide SCAN). Upgrade with every process of the
 * earlier version stopped: one still running would go on writing the old names.
 */
export async function migrateKeyLayout(redis: Redis, log: (message: string, fields: Record<string, unknown>) => void = () => {}): Promise<void> {
  if ((redis as { isCluster?: boolean }).isCluster) return;
  const deadline = Date.now() + MIGRATION_LOCK_MS;
  while ((await redis.get(LAYOUT_KEY)) !== KEY_LAYOUT) {
    if (await redis.set(keys.lock('key-layout'), '1', 'PX', MIGRATION_LOCK_MS, 'NX')) {
      try {
        if ((await redis.get(LAYOUT_KEY)) !== KEY_LAYOUT) log('key layout migrated', await migrate(redis));
      } finally {
        await redis.del(keys.lock('key-layout'));
      }
      return;
    }
    if (Date.now() > deadline) throw new Error('the Redis key layout migration of another process did not finish in time');
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

async function migrate(redis: Redis): Promise<Record<string, unknown>> {
  let renamed = 0;
  let kept = 0;
  await forEachKey(redis, 'rb:*', async (key) => {
    const to = renamedKey(key);
    if (!to || to === key) return;
    if (await redis.renamenx(key, to)) renamed++;
    else kept++;
  });
  // Pool definitions: from one hash to a key each (in the pool's slot) and a set of names.
  if ((await redis.type(keys.pools)) === 'hash') {
    const definitions = await redis.hgetall(keys.pools);
    for (const [pool, json] of Object.entries(definitions)) await redis.set(keys.pool(pool), json, 'NX');
    const names = Object.keys(definitions);
    const replace = redis.multi().del(keys.pools);
    if (names.length) replace.sadd(keys.pools, ...names);
    await replace.exec();
  }
  for (const pool of await redis.smembers(keys.pools)) {
    await forEachKey(redis, `${keys.poolReady(pool, '*', '')}*`, async (list) => void (await redis.sadd(keys.poolReadyLists(pool), list)));
  }
  let counted = 0;
  if (!(await redis.exists(keys.layerRefsComplete))) {
    await forEachKey(redis, keys.sandbox('*'), async (record) => void (counted += await countLayerRefs(redis, record)));
    await redis.set(keys.layerRefsComplete, String(Date.now()));
  }
  await redis.set(LAYOUT_KEY, KEY_LAYOUT);
  return { renamed, keptNewer: kept, layerRefsCounted: counted };
}

/**
 * Counts a live sandbox recorded before layer reference counts existed: its layers and
 * hibernation layer, as a create and a hibernation would have, and its `layerRefs` flag
 * set (so its end uncounts them). Several calls, not one script (the record and the counts
 * are different slots): the migration runs with no other process writing.
 */
async function countLayerRefs(redis: Redis, record: string): Promise<number> {
  const [state, flag, layerDigests, hibernationLayer] = await redis.hmget(record, 'state', 'layerRefs', 'layerDigests', 'hibernationLayer');
  if (!state || state === 'terminated' || state === 'failed' || flag) return 0;
  const digests = [...(JSON.parse(layerDigests ?? '[]') as string[]), ...(hibernationLayer ? [hibernationLayer] : [])];
  for (const digest of digests) await redis.hincrby(keys.layerRefs, digest, 1);
  await redis.hset(record, 'layerRefs', '1');
  return 1;
}

/** Visits the keys matching `match` as SCAN finds them (a key renamed meanwhile may come twice: the visits are idempotent). */
async function forEachKey(redis: Redis, match: string, visit: (key: string) => Promise<void>): Promise<void> {
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', match, 'COUNT', 1000);
    cursor = next;
    for (const key of batch) await visit(key);
  } while (cursor !== '0');
}

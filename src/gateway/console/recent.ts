import type { Redis } from 'ioredis';
import { z } from 'zod';
import type { RecentCreate } from '../../api/index.ts';
import { keys, type SandboxRegistry } from '../../registry/index.ts';

/** The fields of a burst trace entry the console reads (src/burst/trace writes them). */
const TraceEntry = z.object({ atEpochMs: z.number(), sandboxId: z.string().optional(), tenant: z.string().optional() });

/**
 * The latest creates from the burst trace stream (which every gateway appends to), with
 * their sandboxes' state, node and labels now: one XREVRANGE and `limit` record reads,
 * only while someone has the console open.
 */
export async function recentCreates(redis: Redis, registry: Pick<SandboxRegistry, 'get'>, limit: number): Promise<RecentCreate[]> {
  const entries = await redis.xrevrange(keys.burstTrace, '+', '-', 'COUNT', limit);
  const parsed = entries.flatMap(([, fields]) => {
    try {
      const entry = TraceEntry.safeParse(JSON.parse(fields[1] ?? 'null'));
      return entry.success ? [entry.data] : [];
    } catch {
      return [];
    }
  });
  return Promise.all(
    parsed.map(async (e) => {
      const sandbox = e.sandboxId ? await registry.get(e.sandboxId) : undefined;
      return {
        atMs: e.atEpochMs,
        tenant: e.tenant ?? '',
        ...(e.sandboxId ? { sandboxId: e.sandboxId } : {}),
        ...(sandbox ? { state: sandbox.state, labels: sandbox.spec.labels } : { labels: {} }),
        ...(sandbox?.node ? { node: sandbox.node } : {}),
        ...(sandbox?.pool ? { pool: sandbox.pool } : {}),
      };
    }),
  );
}

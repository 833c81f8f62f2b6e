import { z } from 'zod';
import { CloudHostState } from '../../api/index.ts';

/** One cloud host the controller knows of. `providerId` is null for hosts it did not start (operators run them). */
export const HostRecord = z.object({
  id: z.string(),
  providerId: z.string().nullable(),
  state: CloudHostState,
  sandboxes: z.number().int(),
  provisionedAtMs: z.number(),
  idleSinceMs: z.number().nullable(),
  terminatingSinceMs: z.number().nullable(),
});
export type HostRecord = z.infer<typeof HostRecord>;

/** What the leading controller publishes in Redis each tick; every gateway reads it (checked, not cast). */
export const SharedState = z.object({
  diversion: z.object({ diverting: z.boolean(), divertingSinceMs: z.number().nullable(), belowStopSinceMs: z.number().nullable() }),
  utilization: z.number(),
  utilizationAtMs: z.number(),
  hosts: z.array(HostRecord),
  /** Start times of provisions in the last minute (the rate cap). */
  recentProvisionsMs: z.array(z.number()),
  /** Hosts terminated or forgotten recently: their last heartbeats must not look like new hosts. */
  retired: z.array(z.object({ id: z.string(), atMs: z.number() })).default([]),
  /** Provisioned-to-retired time of every cloud host retired so far (VM-hours so far = this + the live hosts' time). */
  retiredVmMs: z.number().default(0),
});
export type SharedState = z.infer<typeof SharedState>;

export const INITIAL_STATE: SharedState = {
  diversion: { diverting: false, divertingSinceMs: null, belowStopSinceMs: null },
  utilization: 0,
  utilizationAtMs: 0,
  hosts: [],
  recentProvisionsMs: [],
  retired: [],
  retiredVmMs: 0,
};

/** A value stored as JSON, checked by `schema`; `fallback` when absent or not valid. */
export function parseStored<T>(json: string | null, schema: { safeParse(v: unknown): { success: true; data: T } | { success: false } }, fallback: T): T {
  if (!json) return fallback;
  try {
    const parsed = schema.safeParse(JSON.parse(json));
    return parsed.success ? parsed.data : fallback;
  } catch {
    return fallback;
  }
}

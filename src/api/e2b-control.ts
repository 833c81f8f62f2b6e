import { z } from 'zod';

/**
 * The E2B control plane's bodies beyond create, list and lifecycle (src/api/e2b.ts): snapshots,
 * fork, metrics and network updates, as the official SDK (2.51) sends them.
 */

/** `POST /sandboxes/:id/snapshots`. */
export const E2bSnapshotBody = z.object({ name: z.string().max(128).optional() });

/** `GET /snapshots`: the tenant's snapshots, of one sandbox or by name; paged like the sandbox list. */
export const E2bSnapshotsQuery = z.object({
  sandboxID: z.string().max(64).optional(),
  name: z.string().max(128).optional(),
  limit: z.coerce.number().int().min(1).max(1000).default(100),
  nextToken: z.string().max(64).optional(),
});

/** One E2B snapshot as rollbox keeps it: the layer its pack made, the sandbox it came from, its names. */
export const E2bSnapshotRecord = z.object({
  snapshotID: z.string(),
  sandboxID: z.string(),
  names: z.array(z.string()),
  createdAt: z.string(),
});
export type E2bSnapshotRecord = z.infer<typeof E2bSnapshotRecord>;

/** `POST /sandboxes/:id/fork`. */
export const E2bForkBody = z.object({
  timeout: z.number().int().min(1).max(7 * 24 * 3600).optional(),
  count: z.number().int().min(1).max(64).optional(),
});

/** `GET /sandboxes/:id/metrics`: unix seconds. */
export const E2bMetricsQuery = z.object({
  start: z.coerce.number().int().min(0).optional(),
  end: z.coerce.number().int().min(0).optional(),
});

/** `PUT /sandboxes/:id/network`: replaces the egress configuration whole (what is omitted is cleared). */
export const E2bNetworkUpdate = z.object({
  allowOut: z.array(z.string().max(253)).max(256).optional(),
  denyOut: z.array(z.string().max(253)).max(256).optional(),
  rules: z.record(z.string(), z.unknown()).optional(),
  egressProxy: z.unknown().optional(),
  allow_internet_access: z.boolean().optional(),
});
export type E2bNetworkUpdate = z.infer<typeof E2bNetworkUpdate>;

/** A sandbox's resource use as a worker host reads it from the sandbox's cgroups (one sample). */
export const SandboxMetrics = z.object({
  timestamp: z.string(),
  /** CPU used since the previous sample of this sandbox (or its start), as a share of `cpuCount` cores, in percent. */
  cpuUsedPct: z.number(),
  cpuCount: z.number().int(),
  memUsed: z.number().int(),
  memTotal: z.number().int(),
  memCache: z.number().int(),
  diskUsed: z.number().int(),
  diskTotal: z.number().int(),
});
export type SandboxMetrics = z.infer<typeof SandboxMetrics>;

import { z } from 'zod';
import { ImageSpec, LayerDigest, ResourceFields, SandboxClass, requestsWithinLimits } from './sandbox.ts';

export const PoolName = z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/, 'pool names are [a-z0-9-], at most 63 characters');

/**
 * A warm pool: every worker host keeps `size` ready sandboxes of it (created in advance,
 * running the init, nothing of any tenant in them). A create whose image, disk and class
 * match takes one; its limits may differ (they are set when it is claimed).
 */
export const PutPoolRequest = z.strictObject({
  image: ImageSpec.default({ base: 'busybox', layers: [] }),
  /** Limits of the ready sandboxes, and what they reserve on their host until claimed. */
  resources: ResourceFields.omit({ diskMiB: true }).refine(...requestsWithinLimits).default({ cpuMillis: 1000, memoryMiB: 512, pids: 256 }),
  class: SandboxClass.default('latency'),
  diskMiB: ResourceFields.shape.diskMiB,
  /** Ready sandboxes per worker host (0 keeps the pool defined but empty). */
  size: z.number().int().min(0).max(4096),
  /** The worker hosts that keep it: those of this host pool (`ROLLBOX_POOL`; cloud burst hosts are `cloud`). */
  hostPool: z.string().regex(/^[a-z0-9-]{1,32}$/).default('local'),
});
export type PutPoolRequest = z.infer<typeof PutPoolRequest>;

/** A pool as stored: the request, its layers resolved, and a version that changes with its spec. */
export const PoolRecord = PutPoolRequest.extend({
  name: PoolName,
  layerDigests: z.array(LayerDigest),
  /** Ready sandboxes of an older version are never handed out; hosts replace them. */
  version: z.string(),
  createdAt: z.string(),
  updatedAt: z.string(),
});
export type PoolRecord = z.infer<typeof PoolRecord>;

export const Pool = PoolRecord.extend({
  status: z.object({
    /** size x the worker hosts that report the pool. */
    target: z.number().int(),
    ready: z.number().int(),
    starting: z.number().int(),
    hosts: z.array(z.object({ nodeId: z.string(), ready: z.number().int(), starting: z.number().int() })),
    /** Creates served from the pool, and creates that matched it but found no ready sandbox (cold creates), over the last 60 s. */
    claimsPerMinute: z.number().int(),
    missesPerMinute: z.number().int(),
  }),
});
export type Pool = z.infer<typeof Pool>;

export const PoolList = z.object({ pools: z.array(Pool) });
export type PoolList = z.infer<typeof PoolList>;

/** What a worker host reports of each pool it keeps. */
export const NodePoolStatus = z.object({ version: z.string(), ready: z.number().int(), starting: z.number().int() });
export type NodePoolStatus = z.infer<typeof NodePoolStatus>;

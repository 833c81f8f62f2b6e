import { z } from 'zod';
import { LayerName } from './layer.ts';
import { CreateSandboxRequest, LayerDigest, Lineage, NetworkPolicy, ResourceFields, SandboxState } from './sandbox.ts';

/** Children of one fork at most (each one is a sandbox, counted against the tenant's quota). */
export const MAX_FORK_CHILDREN = 64;

const ForkCount = z.number().int().min(1).max(MAX_FORK_CHILDREN);

const { cpuMillis, memoryMiB, diskMiB, pids, requests } = ResourceFields.shape;
/** The limits given replace the parent's, one by one (no defaults: what is not given stays the parent's). */
export const ResourceOverrides = z.strictObject({
  cpuMillis: cpuMillis.unwrap().optional(),
  memoryMiB: memoryMiB.unwrap().optional(),
  diskMiB: diskMiB.unwrap().optional(),
  pids: pids.unwrap().optional(),
  requests,
});

/**
 * `POST /v1/sandboxes/:id/fork`: N children whose files are the parent's at the fork point.
 * The parts given replace the parent's in every child (default: the parent's labels,
 * network policy, TTL and resources, each limit on its own); everything else (image, env, workdir, user, class,
 * hidden paths, job) is the parent's.
 */
export const ForkRequest = z.strictObject({
  count: ForkCount,
  labels: CreateSandboxRequest.shape.labels.unwrap().optional(),
  network: NetworkPolicy.optional(),
  ttlSeconds: CreateSandboxRequest.shape.ttlSeconds.unwrap().optional(),
  resources: ResourceOverrides.optional(),
  /**
   * Also keep the fork point as a snapshot (a read-only layer, answered as `forkLayer`;
   * with `name`, named and kept as a named snapshot is), to fork from it again later with
   * `POST /v1/snapshots/:digest/fork`. Without it, children on the parent's host start
   * from clones of its disk and a layer is packed only when a child goes to another host
   * (or the host cannot clone disks).
   */
  snapshot: z.strictObject({ name: LayerName.optional() }).optional(),
  /**
   * Whether the children keep the parent's processes (its memory saved whole and restored in
   * each: the microVM tier, where it is the default). false: files only, each child a fresh
   * sandbox over the parent's files (the container tier's only way: true there is
   * `tier_unsupported`). A microVM child that keeps processes has its parent's memory, vCPUs
   * and disk size: other `resources` for those answer `invalid_request`.
   */
  processes: z.boolean().optional(),
});
export type ForkRequest = z.infer<typeof ForkRequest>;

/**
 * `POST /v1/snapshots/:digest/fork`: N children on a snapshot (the layer a
 * `POST /v1/sandboxes/:id/snapshot` answered) stacked on its parents. A snapshot keeps
 * files, not a sandbox's settings: the children take what a create takes (image aside).
 */
export const SnapshotForkRequest = CreateSandboxRequest.omit({ image: true }).extend({ count: ForkCount });
export type SnapshotForkRequest = z.infer<typeof SnapshotForkRequest>;

export const ForkChild = z.object({
  /** The child's sandbox id (absent: refused before it was recorded). */
  id: z.string().optional(),
  /** Absent: refused before it was recorded (quota, no capacity). */
  state: SandboxState.optional(),
  /** Why this child was not created; the other children are unaffected. */
  error: z.object({ code: z.string(), message: z.string() }).optional(),
});
export type ForkChild = z.infer<typeof ForkChild>;

export const ForkResult = z.object({
  parent: z.string(),
  parentKind: Lineage.shape.parentKind,
  /** The fork point (see Lineage): present when children started from clones of the parent's disk. */
  forkPoint: z.string().optional(),
  /** The fork point as a read-only layer: present when one was packed (asked with `snapshot`, a child on another host, a host that cannot clone disks, a hibernated parent or a snapshot). */
  forkLayer: LayerDigest.optional(),
  forkedAt: z.string(),
  /** How long the parent was frozen for the fork point (absent: it was not frozen for this fork). */
  parentFrozenMs: z.number().optional(),
  /**
   * true: every child is the parent's VM restored from one save of it (every process, its memory
   * and tmpfs, its files), renamed, its clock and entropy its own. false: files only, each child
   * starting fresh processes over the parent's files (the container tier, or asked).
   */
  processes: z.boolean(),
  /**
   * processes: true: the commands running in the parent at the fork point. Their callers get
   * their results from the parent; in each child their processes run on, detached, their
   * output dropped, and they are not in the child's command log.
   */
  detachedCommands: z.array(z.string()).optional(),
  /** In request order. */
  children: z.array(ForkChild),
  created: z.number().int(),
  refused: z.number().int(),
});
export type ForkResult = z.infer<typeof ForkResult>;

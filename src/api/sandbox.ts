import { z } from 'zod';
import { ModelHoldState } from './model.ts';

/** sha256 of a layer's EROFS image, as `sha256:<64 hex>`. */
export const LayerDigest = z.string().regex(/^sha256:[0-9a-f]{64}$/, 'must be sha256:<64 hex digits>');
export type LayerDigest = z.infer<typeof LayerDigest>;

/** A layer named by digest or by registered name (`busybox`, `python-3.12`, ...). */
export const LayerRef = z.union([LayerDigest, z.string().regex(/^[a-z0-9][a-z0-9._-]{0,127}$/, 'must be a digest or a layer name')]);
export type LayerRef = z.infer<typeof LayerRef>;

/**
 * An image in an OCI registry, as `docker pull` takes it: `[registry/]name[:tag][@digest]`
 * (`docker.io/library/` implied, tag `latest` by default). Checked in full where it is
 * pulled (src/oci-registry); here only its alphabet and length.
 */
export const ImageRef = z.string().min(1).max(512).regex(/^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$/, 'ref is [registry/]name[:tag][@digest]');
export type ImageRef = z.infer<typeof ImageRef>;

/** `os/architecture[/variant]`, as in an OCI index (`linux/amd64`, `linux/arm64/v8`). */
export const Platform = z.string().max(64).regex(/^[a-z0-9]+\/[a-z0-9_]+(\/[a-z0-9]+)?$/, 'platform is os/architecture[/variant]');

/**
 * `base` (a layer or an imported image, default `busybox`) or `ref` (an image in a
 * registry: pulled first unless an image holds it already, as `docker run` does), then
 * `layers` on top. The gateway turns a `ref` into the `base` of the image holding it.
 */
export const ImageSpec = z
  .strictObject({
    base: LayerRef.optional(),
    ref: ImageRef.optional(),
    /** With `ref`: which platform of a multi-platform image (default `linux/amd64`). */
    platform: Platform.optional(),
    /** Stacked on top of base, lowest first. */
    layers: z.array(LayerRef).max(32).default([]),
  })
  .refine((s) => !(s.base !== undefined && s.ref !== undefined), 'image takes base or ref, not both')
  .refine((s) => s.platform === undefined || s.ref !== undefined, 'image.platform goes with image.ref');
export type ImageSpec = z.infer<typeof ImageSpec>;

/** The layer or image a spec stacks on (before a `ref` is resolved, the default base). */
export const baseOf = (spec: Pick<ImageSpec, 'base'>): string => spec.base ?? 'busybox';

/**
 * Limits cap what a sandbox may use; `requests` are what it reserves on its host, which is
 * what placement and admission count (as Kubernetes separates requests and limits). Idle
 * agents use little of their limits, so requests are small by default (the gateway's
 * ROLLBOX_DEFAULT_REQUEST_* settings, never above the limit) and a host holds thousands.
 */
export const ResourceFields = z.strictObject({
  cpuMillis: z.number().int().min(10).max(64_000).default(1000),
  memoryMiB: z.number().int().min(8).max(262_144).default(512),
  diskMiB: z.number().int().min(1).max(1_048_576).default(1024),
  pids: z.number().int().min(8).max(65_536).default(256),
  requests: z.strictObject({ cpuMillis: z.number().int().min(1).max(64_000), memoryMiB: z.number().int().min(1).max(262_144) }).partial().optional(),
});
/** Requests within the limits. */
export const requestsWithinLimits = [
  (r: { cpuMillis: number; memoryMiB: number; requests?: { cpuMillis?: number; memoryMiB?: number } }) => (r.requests?.cpuMillis ?? 0) <= r.cpuMillis && (r.requests?.memoryMiB ?? 0) <= r.memoryMiB,
  'requests may not exceed the limits',
] as const;
export const Resources = ResourceFields.refine(...requestsWithinLimits);
export type Resources = z.infer<typeof Resources>;

/**
 * What a sandbox reserves on its host (placement, admission): its requests, or its limits
 * for a record made before requests existed. Disk is reserved as asked.
 */
export function reservationOf(resources: Pick<Resources, 'cpuMillis' | 'memoryMiB' | 'diskMiB' | 'requests'>): { cpuMillis: number; memoryMiB: number; diskMiB: number } {
  return { cpuMillis: resources.requests?.cpuMillis ?? resources.cpuMillis, memoryMiB: resources.requests?.memoryMiB ?? resources.memoryMiB, diskMiB: resources.diskMiB };
}

export const SandboxClass = z.enum(['latency', 'besteffort']);
export type SandboxClass = z.infer<typeof SandboxClass>;

const PortSpec = z.union([
  z.number().int().min(1).max(65_535),
  z
    .string()
    .regex(/^\d{1,5}-\d{1,5}$/, 'a port range is "from-to"')
    .refine((r) => {
      const [from, to] = r.split('-').map(Number);
      return from! >= 1 && to! <= 65_535 && from! <= to!;
    }, 'a port range is "from-to" with 1 <= from <= to <= 65535'),
]);

/**
 * One allowed destination: `cidr` (an address or CIDR; IPv6 is accepted but has no effect,
 * sandboxes have no IPv6) or `host` (resolved by the platform's resolver when the policy is
 * applied; the sandbox's DNS answers that name with those addresses). Destinations that are
 * always blocked (link-local, the host's addresses, other sandboxes) stay blocked when listed.
 */
export const NetworkAllowRule = z
  .strictObject({
    cidr: z.union([z.ipv4(), z.cidrv4(), z.ipv6(), z.cidrv6()]).optional(),
    host: z
      .string()
      .max(253)
      .regex(/^(?=.{1,253}$)([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$/, 'must be a hostname')
      .optional(),
    /** Ports or "from-to" ranges; absent: every port. */
    ports: z.array(PortSpec).min(1).max(64).optional(),
    protocol: z.enum(['tcp', 'udp', 'any']).default('tcp'),
  })
  .refine((r) => (r.cidr === undefined) !== (r.host === undefined), 'an allow entry has exactly one of cidr and host');
export type NetworkAllowRule = z.infer<typeof NetworkAllowRule>;

export const NetworkPolicy = z.strictObject({
  mode: z.enum(['none', 'allowlist']).default('none'),
  allow: z.array(NetworkAllowRule).max(256).default([]),
  /**
   * Also reach the rollbox gateway at `http://gateway.rollbox.internal:9180` (a hosted
   * rollout's agent sandbox): its worker host's kernel sends it on to a gateway, whatever `mode` allows.
   */
  gateway: z.boolean().optional(),
});
export type NetworkPolicy = z.infer<typeof NetworkPolicy>;

/** Where a sandbox whose network has `gateway: true` reaches the gateway (its worker host's kernel sends it on). */
export const SANDBOX_GATEWAY = { host: 'gateway.rollbox.internal', port: 9180 } as const;
export const SANDBOX_GATEWAY_URL = `http://${SANDBOX_GATEWAY.host}:${SANDBOX_GATEWAY.port}`;

/** Whether the sandbox gets a veth (and a /30 of the pool): an allowlist, or the gateway's reach. */
export const hasNetwork = (policy: Pick<NetworkPolicy, 'mode' | 'gateway'>): boolean => policy.mode === 'allowlist' || policy.gateway === true;

/** What one sandbox's env may hold in all (names and values, in characters): a process's environment must fit execve's limits with room to spare. */
const ENV_MAX_CHARS = 256 * 1024;
const EnvMap = z
  .record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'env names are [A-Za-z_][A-Za-z0-9_]*').max(256), z.string().max(32_768).refine((v) => !v.includes('\0'), 'must not contain NUL'))
  .refine((env) => Object.entries(env).reduce((n, [k, v]) => n + k.length + v.length + 2, 0) <= ENV_MAX_CHARS, `env holds more than ${ENV_MAX_CHARS} characters in all`);
const AbsolutePath = z.string().startsWith('/', 'must be an absolute path').max(4096).refine((p) => !p.includes('\0'), 'must not contain NUL');
/** A user as in an image config: `name`, `uid`, `name:group` or `uid:gid`, resolved against the sandbox's own /etc/passwd and /etc/group. */
export const ExecUser = z.string().regex(/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?$/, 'user is name, uid, name:group or uid:gid');
const LabelMap = z.record(z.string().regex(/^[A-Za-z0-9_./-]{1,63}$/, 'label keys are [A-Za-z0-9_./-]{1,63}'), z.string().max(256));

/**
 * `container`: runc over overlayfs (the default). `microvm`: its own guest kernel in a
 * QEMU microVM (docs/microvm.md); what it cannot do yet answers `tier_unsupported`.
 */
export const SandboxTier = z.enum(['container', 'microvm']);
export type SandboxTier = z.infer<typeof SandboxTier>;

/**
 * freeze: cgroup freezer (memory stays); swap: frozen, then its memory paged out to its
 * host's swap file (page cache dropped), processes kept; resume reads it back, then thaws
 * (containers; docs/operations.md "Pausing"); hibernate: pack the writable layer into a
 * layer and free the host (resume starts it again).
 */
export const PauseMode = z.enum(['freeze', 'swap', 'hibernate']);
export type PauseMode = z.infer<typeof PauseMode>;

export const CreateSandboxRequest = z.strictObject({
  /** Absent: container (records made before tiers existed read the same). */
  tier: SandboxTier.optional(),
  image: ImageSpec.default({ base: 'busybox', layers: [] }),
  resources: Resources.default({ cpuMillis: 1000, memoryMiB: 512, diskMiB: 1024, pids: 256 }),
  class: SandboxClass.default('latency'),
  network: NetworkPolicy.default({ mode: 'none', allow: [] }),
  hiddenPaths: z.array(AbsolutePath).max(256).default([]),
  env: EnvMap.default({}),
  /** Default: the image's WorkingDir (an imported image), else `/`. */
  workdir: AbsolutePath.optional(),
  /** Who commands run as unless an exec says otherwise (`name`, `uid`, `name:group`, `uid:gid`); default: the image's User, else root. */
  user: ExecUser.optional(),
  /** The sandbox is stopped this long after it starts running. */
  ttlSeconds: z.number().int().min(1).max(7 * 24 * 3600).default(3600),
  labels: LabelMap.default({}),
  /** Training job id: job-level pause/resume acts on every sandbox carrying it. */
  job: z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/).optional(),
  /** stayLocal: never divert this sandbox to the cloud pool (cloud burst). */
  placement: z.strictObject({ stayLocal: z.boolean().default(false) }).optional(),
  /**
   * What the TTL does (absent: `destroy`, the sandbox ends `failed(timeout)`). `pause`: it is
   * paused in `mode` instead (E2B's auto-pause), then kept paused `pausedTtlSeconds` before it
   * ends; a resume (E2B's connect) brings it back.
   */
  onTtl: z
    .strictObject({
      action: z.enum(['destroy', 'pause']),
      mode: PauseMode.default('freeze'),
      pausedTtlSeconds: z.number().int().min(1).max(7 * 24 * 3600).default(24 * 3600),
      /** E2B's `autoResume`: a call into the paused sandbox through the E2B surface (commands, files) resumes it, for its `ttlSeconds` again. */
      autoResume: z.boolean().optional(),
    })
    .optional(),
  /**
   * Traffic into the sandbox's ports (the port proxy, `getHost`) needs no access token: E2B's
   * `network.allowPublicTraffic`. Absent or false: the sandbox's access token is required.
   */
  publicTraffic: z.boolean().optional(),
  /**
   * Setuid programs (sudo) may raise a process's privileges inside the sandbox (Kubernetes'
   * allowPrivilegeEscalation): its processes run without no_new_privs. Never beyond the
   * sandbox's own root (its capability bounding set, seccomp and namespaces stay).
   */
  allowPrivilegeEscalation: z.boolean().optional(),
});
export type CreateSandboxRequest = z.infer<typeof CreateSandboxRequest>;

export const SandboxState = z.enum(['pending', 'creating', 'running', 'paused', 'hibernated', 'stopping', 'terminated', 'failed']);
export type SandboxState = z.infer<typeof SandboxState>;

/**
 * `init_lost`: the sandbox's PID 1 (rollbox-init) died; nothing it ran can report a result any more.
 * `guest_panic`: a microVM's guest kernel panicked or stopped the machine itself (its own
 * kernel, which root in the guest can crash); the detail quotes the kernel's last words.
 * `layer_lost`: a layer it read on demand could no longer be guarded on its host (the host's
 * gate died together with its keeper), so unread data might have read as zeros: it is ended first.
 */
export const FailureReason = z.enum(['oom', 'timeout', 'admission_exhausted', 'infra_error', 'lost', 'init_lost', 'layer_lost', 'guest_panic']);
export type FailureReason = z.infer<typeof FailureReason>;

export const TERMINAL_STATES: readonly SandboxState[] = ['terminated', 'failed'];

/**
 * Every allowed move. A state never moves backwards: terminal states have no exits,
 * and pause/resume only cycle among the live states.
 */
export const STATE_TRANSITIONS: Readonly<Record<SandboxState, readonly SandboxState[]>> = {
  pending: ['creating', 'stopping', 'terminated', 'failed'],
  creating: ['running', 'stopping', 'terminated', 'failed'],
  running: ['paused', 'hibernated', 'stopping', 'terminated', 'failed'],
  paused: ['running', 'hibernated', 'stopping', 'terminated', 'failed'],
  hibernated: ['creating', 'running', 'stopping', 'terminated', 'failed'],
  stopping: ['terminated', 'failed'],
  terminated: [],
  failed: [],
};

export function isTerminal(state: SandboxState): boolean {
  return TERMINAL_STATES.includes(state);
}

/** Where a child came from: recorded on its sandbox record, shown by `GET /v1/sandboxes/:id`. */
export const Lineage = z.object({
  /** The parent: a sandbox id (`sbx_...`), or a snapshot's layer digest. */
  parent: z.string(),
  parentKind: z.enum(['sandbox', 'snapshot']),
  /**
   * The fork point, named: the parent's disk frozen into a clone on the parent's host at
   * that moment. A child with a fork point and no forkLayer started from a clone of it (its
   * own disk shares the parent's blocks until either writes them).
   */
  forkPoint: z.string().optional(),
  /** The fork point as a read-only layer, shared by every child that stacks it (children on other hosts, snapshots, hibernated parents). */
  forkLayer: LayerDigest.optional(),
  /**
   * The child kept its parent's processes: a microVM restored from the fork point's image (the
   * parent's memory, devices and disk, saved whole), renamed, its clock and entropy its own.
   */
  processes: z.boolean().optional(),
  forkedAt: z.string(),
});
export type Lineage = z.infer<typeof Lineage>;

/** The sandbox record kept in Redis and returned by the API. */
export const Sandbox = z.object({
  id: z.string(),
  tenant: z.string(),
  state: SandboxState,
  failureReason: FailureReason.optional(),
  /** Human-readable detail for failures and terminations. */
  detail: z.string().optional(),
  node: z.string().optional(),
  spec: CreateSandboxRequest,
  /** Layer digests, base first, resolved at creation. */
  layerDigests: z.array(LayerDigest),
  /** While hibernated: the packed writable layer, restored into the upper dir on wake. */
  hibernationLayer: LayerDigest.optional(),
  /** While hibernated whole, processes and all (a microVM): its image is in the layer store (`hibernated/<id>`), restored on wake. */
  hibernatedWhole: z.boolean().optional(),
  /** While paused with `swap`: what it still held in its host's memory and what was in swap, as of the pause. */
  swapped: z.object({ residentBytes: z.number().int(), swappedBytes: z.number().int() }).optional(),
  createdAt: z.string(),
  startedAt: z.string().optional(),
  endedAt: z.string().optional(),
  expiresAt: z.string().optional(),
  /** Processes killed by the memory limit so far. */
  oomKills: z.number().int().default(0),
  /** The warm pool it was taken from (absent: a cold create). */
  pool: z.string().optional(),
  /** A fork's child: its parent and fork point. */
  lineage: Lineage.optional(),
});
export type Sandbox = z.infer<typeof Sandbox>;

export const ListSandboxesQuery = z.strictObject({
  job: z.string().max(128).optional(),
  /** `key=value` */
  label: z.string().max(320).optional(),
  state: SandboxState.optional(),
  limit: z.coerce.number().int().min(1).max(1000).default(100),
});
export type ListSandboxesQuery = z.infer<typeof ListSandboxesQuery>;

export const SandboxList = z.object({ sandboxes: z.array(Sandbox) });
export type SandboxList = z.infer<typeof SandboxList>;

/** A new TTL: the sandbox ends this long from now (sooner or later than it would have). */
export const TtlRequest = z.strictObject({ ttlSeconds: z.number().int().min(1).max(7 * 24 * 3600) });
export type TtlRequest = z.infer<typeof TtlRequest>;

export const PauseRequest = z.strictObject({
  mode: PauseMode.default('freeze'),
});
export type PauseRequest = z.infer<typeof PauseRequest>;

/** A new task stage: the parts given replace the sandbox's current ones. */
export const PolicyPatch = z
  .strictObject({
    network: NetworkPolicy.optional(),
    hiddenPaths: z.array(AbsolutePath).max(256).optional(),
  })
  .refine((p) => p.network !== undefined || p.hiddenPaths !== undefined, 'give network, hiddenPaths or both');
export type PolicyPatch = z.infer<typeof PolicyPatch>;

export const JobActionResult = z.object({
  job: z.string(),
  /** The job's model calls (the model gateway): held by a pause, released by a resume. */
  model: ModelHoldState.optional(),
  results: z.array(
    z.object({
      id: z.string(),
      node: z.string().optional(),
      /** done: changed now; unchanged: it already was; failed: see error. */
      outcome: z.enum(['done', 'unchanged', 'failed']),
      state: SandboxState,
      error: z.object({ code: z.string(), message: z.string() }).optional(),
    }),
  ),
});
export type JobActionResult = z.infer<typeof JobActionResult>;

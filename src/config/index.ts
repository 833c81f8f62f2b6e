import { z } from 'zod';
import os from 'node:os';
import path from 'node:path';

/**
 * The one environment schema. `loadConfig` is called once by the composition root
 * (the CLI); everything else receives the parsed `Config` (or the slice it needs).
 */
const Env = z.object({
  REDIS_URL: z.string().url().optional(),
  ROLLBOX_DATA_DIR: z.string().default('./.rollbox'),
  ROLLBOX_PORT: z.coerce.number().int().min(0).max(65_535).default(8080),
  ROLLBOX_HOST: z.string().default('127.0.0.1'),
  ROLLBOX_NODE_ID: z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/).optional(),
  ROLLBOX_POOL: z.string().regex(/^[a-z0-9-]{1,32}$/).default('local'),
  ROLLBOX_RUNTIME: z.string().default('runc'),
  /** Shared, content-addressed layer store; defaults to <dataDir>/layers. */
  ROLLBOX_LAYER_STORE: z.string().optional(),
  ROLLBOX_LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),

  ROLLBOX_JWT_ALG: z.enum(['HS256', 'EdDSA', 'ES256']).default('HS256'),
  /** HS256 secret file; created with a random secret when absent (embedded default). */
  ROLLBOX_JWT_SECRET_FILE: z.string().optional(),
  /** PEM public key (SPKI) for EdDSA/ES256. */
  ROLLBOX_JWT_PUBLIC_KEY_FILE: z.string().optional(),
  ROLLBOX_JWKS_URL: z.string().url().optional(),
  ROLLBOX_JWT_ISSUER: z.string().default('rollbox'),
  ROLLBOX_JWT_AUDIENCE: z.string().default('rollbox-api'),
  ROLLBOX_JWT_CLOCK_TOLERANCE_SEC: z.coerce.number().int().min(0).max(300).default(5),

  ROLLBOX_TENANT_MAX_SANDBOXES: z.coerce.number().int().min(1).default(1000),
  ROLLBOX_BODY_LIMIT_BYTES: z.coerce.number().int().min(1024).default(16 * 1024 * 1024),
  ROLLBOX_LAYER_UPLOAD_LIMIT_BYTES: z.coerce.number().int().min(1024).default(2 * 1024 * 1024 * 1024),
  ROLLBOX_PLACEMENT_CHOICES: z.coerce.number().int().min(1).max(16).default(2),
  ROLLBOX_PLACEMENT_MAX_REFUSALS: z.coerce.number().int().min(1).max(64).default(3),
  ROLLBOX_CREATE_TIMEOUT_MS: z.coerce.number().int().min(100).default(60_000),

  ROLLBOX_NODE_MEMORY_MIB: z.coerce.number().int().min(64).optional(),
  ROLLBOX_NODE_CPU_MILLIS: z.coerce.number().int().min(100).optional(),
  /** CPU may be promised past physical capacity (DSec oversubscribes idle agents). */
  ROLLBOX_NODE_CPU_OVERCOMMIT: z.coerce.number().min(1).max(64).default(8),
  ROLLBOX_NODE_MAX_SANDBOXES: z.coerce.number().int().min(1).default(2000),
  /** Sum of diskMiB promised, as a multiple of the scratch space (disks are sparse; see scratch.ts). */
  ROLLBOX_NODE_DISK_OVERCOMMIT: z.coerce.number().min(1).max(1000).default(8),
  /** Size of the scratch filesystem holding sandbox disks; default half the free space under the data dir, at most 64. */
  ROLLBOX_NODE_SCRATCH_GIB: z.coerce.number().positive().optional(),
  ROLLBOX_NODE_MAX_STARTING: z.coerce.number().int().min(1).default(16),
  /** Host memory kept free for the host itself: below it, the node refuses new sandboxes. */
  ROLLBOX_NODE_HOST_RESERVE_MIB: z.coerce.number().int().min(0).default(256),
  ROLLBOX_HEARTBEAT_MS: z.coerce.number().int().min(50).default(1000),
  ROLLBOX_NODE_LOST_AFTER_MS: z.coerce.number().int().min(200).default(5000),
  ROLLBOX_EXEC_OUTPUT_CAP_BYTES: z.coerce.number().int().min(1024).default(1024 * 1024),
  /**
   * How long one command a caller waits on, in a latency sandbox, holds this host's besteffort
   * sandboxes at 1% of a CPU (the stand-in for core scheduling; see besteffort-guard.ts); 0 = off.
   */
  ROLLBOX_BESTEFFORT_HOLD_MS: z.coerce.number().int().min(0).default(10_000),
  /** CPU each besteffort sandbox keeps while held, millicores; 10 is the kernel's least (1 ms per 100 ms). */
  ROLLBOX_BESTEFFORT_HELD_CPU_MILLIS: z.coerce.number().int().min(10).max(100_000).default(10),
  /** Largest file or tar the files API moves in one request (it travels through Redis). */
  ROLLBOX_FILES_MAX_BYTES: z.coerce.number().int().min(1024).max(512 * 1024 * 1024).default(64 * 1024 * 1024),
  /** A layer nothing references is collected once it has stayed unreferenced this long. */
  ROLLBOX_LAYER_GC_GRACE_MS: z.coerce.number().int().min(0).default(10 * 60_000),
  ROLLBOX_LAYER_GC_INTERVAL_MS: z.coerce.number().int().min(100).default(60_000),

  /** Worker host: layers (names or digests, comma-separated) to sync into its own store before it reports ready; "cluster" = the cluster's pre-synced set. Default: "cluster" in pool cloud, none elsewhere. */
  ROLLBOX_SYNC_LAYERS: z.string().optional(),
  /** Worker host: gateway to fetch layer blobs from, and a token with layer read scope. */
  ROLLBOX_GATEWAY_URL: z.string().url().optional(),
  ROLLBOX_GATEWAY_TOKEN: z.string().optional(),
  /** Gateway: the cluster's pre-synced layer set (names or digests, comma-separated); only requests within it may burst. */
  ROLLBOX_BURST_SYNC_LAYERS: z.string().default('busybox'),
  /** Gateway: how cloud hosts are started: none (operators run them), local (processes here, for demos and tests), command. */
  ROLLBOX_BURST_PROVIDER: z.enum(['none', 'local', 'command']).default('none'),
  ROLLBOX_BURST_PROVISION_CMD: z.string().optional(),
  ROLLBOX_BURST_TERMINATE_CMD: z.string().optional(),
  ROLLBOX_BURST_LIST_CMD: z.string().optional(),
  ROLLBOX_BURST_CMD_TIMEOUT_MS: z.coerce.number().int().min(100).default(60_000),
  ROLLBOX_BURST_TICK_MS: z.coerce.number().int().min(50).default(1000),
  /** The gateway URL cloud hosts use (default: this gateway's own URL). */
  ROLLBOX_BURST_GATEWAY_URL: z.string().url().optional(),
  /** Create events kept in the trace stream (`rollbox burst record` exports them); 0 turns recording off. */
  ROLLBOX_BURST_TRACE_MAX_EVENTS: z.coerce.number().int().min(0).default(1_000_000),
  /** Veth addresses of allowlist sandboxes, one /30 each; shared by the workers of a host. */
  ROLLBOX_NET_POOL: z.string().default('10.200.0.0/16'),
  /** Host-wide address leases of that pool (one file per /30). */
  ROLLBOX_NET_LEASE_DIR: z.string().default('/run/rollbox/net'),
  /** Comma-separated CIDRs no sandbox may reach, on top of the built-in list (e.g. internal services). */
  ROLLBOX_NET_BLOCK: z.string().default(''),
  /** `name=ip|ip,name2=ip`: allowlisted hostnames resolved from this map instead of the host's resolver. */
  ROLLBOX_NET_STATIC_HOSTS: z.string().default(''),
});

export type Config = ReturnType<typeof loadConfig>;

export function loadConfig(env: NodeJS.ProcessEnv, overrides: Partial<Record<keyof z.infer<typeof Env>, string | undefined>> = {}) {
  const merged: Record<string, string | undefined> = { ...env };
  for (const [k, v] of Object.entries(overrides)) if (v !== undefined) merged[k] = v;
  const parsed = Env.safeParse(merged);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
    throw new Error(`invalid configuration: ${issues}`);
  }
  const e = parsed.data;
  const dataDir = path.resolve(e.ROLLBOX_DATA_DIR);
  const hostMemoryMiB = Math.floor(os.totalmem() / 1024 / 1024);
  return {
    redisUrl: e.REDIS_URL,
    dataDir,
    http: { host: e.ROLLBOX_HOST, port: e.ROLLBOX_PORT, bodyLimitBytes: e.ROLLBOX_BODY_LIMIT_BYTES, layerUploadLimitBytes: e.ROLLBOX_LAYER_UPLOAD_LIMIT_BYTES },
    logLevel: e.ROLLBOX_LOG_LEVEL,
    layerStoreDir: path.resolve(e.ROLLBOX_LAYER_STORE ?? path.join(dataDir, 'layers')),
    jwt: {
      alg: e.ROLLBOX_JWT_ALG,
      secretFile: e.ROLLBOX_JWT_SECRET_FILE ?? path.join(dataDir, 'jwt-secret'),
      publicKeyFile: e.ROLLBOX_JWT_PUBLIC_KEY_FILE,
      jwksUrl: e.ROLLBOX_JWKS_URL,
      issuer: e.ROLLBOX_JWT_ISSUER,
      audience: e.ROLLBOX_JWT_AUDIENCE,
      clockToleranceSec: e.ROLLBOX_JWT_CLOCK_TOLERANCE_SEC,
    },
    quota: { maxLiveSandboxesPerTenant: e.ROLLBOX_TENANT_MAX_SANDBOXES },
    files: { maxBytes: e.ROLLBOX_FILES_MAX_BYTES },
    layerGc: { graceMs: e.ROLLBOX_LAYER_GC_GRACE_MS, intervalMs: e.ROLLBOX_LAYER_GC_INTERVAL_MS },
    placement: { choices: e.ROLLBOX_PLACEMENT_CHOICES, maxRefusals: e.ROLLBOX_PLACEMENT_MAX_REFUSALS, createTimeoutMs: e.ROLLBOX_CREATE_TIMEOUT_MS },
    node: {
      /** Unset: the worker keeps a generated id in its data dir. */
      nodeId: e.ROLLBOX_NODE_ID,
      pool: e.ROLLBOX_POOL,
      runtimeBinary: e.ROLLBOX_RUNTIME,
      memoryMiB: e.ROLLBOX_NODE_MEMORY_MIB ?? Math.floor(hostMemoryMiB * 0.85),
      cpuMillis: e.ROLLBOX_NODE_CPU_MILLIS ?? Math.round(os.availableParallelism() * 1000 * e.ROLLBOX_NODE_CPU_OVERCOMMIT),
      maxSandboxes: e.ROLLBOX_NODE_MAX_SANDBOXES,
      diskOvercommit: e.ROLLBOX_NODE_DISK_OVERCOMMIT,
      scratchSizeGiB: e.ROLLBOX_NODE_SCRATCH_GIB,
      maxStarting: e.ROLLBOX_NODE_MAX_STARTING,
      hostReserveMiB: e.ROLLBOX_NODE_HOST_RESERVE_MIB,
      heartbeatMs: e.ROLLBOX_HEARTBEAT_MS,
      lostAfterMs: e.ROLLBOX_NODE_LOST_AFTER_MS,
      execOutputCapBytes: e.ROLLBOX_EXEC_OUTPUT_CAP_BYTES,
      besteffortHoldMs: e.ROLLBOX_BESTEFFORT_HOLD_MS,
      besteffortHeldCpuMillis: e.ROLLBOX_BESTEFFORT_HELD_CPU_MILLIS,
      syncLayers: parseList(e.ROLLBOX_SYNC_LAYERS ?? (e.ROLLBOX_POOL === 'cloud' ? 'cluster' : '')),
      gatewayUrl: e.ROLLBOX_GATEWAY_URL,
      gatewayToken: e.ROLLBOX_GATEWAY_TOKEN,
    },
    burst: {
      syncLayers: parseList(e.ROLLBOX_BURST_SYNC_LAYERS),
      provider: e.ROLLBOX_BURST_PROVIDER,
      commands: { provision: e.ROLLBOX_BURST_PROVISION_CMD, terminate: e.ROLLBOX_BURST_TERMINATE_CMD, list: e.ROLLBOX_BURST_LIST_CMD, timeoutMs: e.ROLLBOX_BURST_CMD_TIMEOUT_MS },
      tickMs: e.ROLLBOX_BURST_TICK_MS,
      gatewayUrl: e.ROLLBOX_BURST_GATEWAY_URL,
      traceMaxEvents: e.ROLLBOX_BURST_TRACE_MAX_EVENTS,
    },
    network: {
      poolCidr: e.ROLLBOX_NET_POOL,
      leaseDir: e.ROLLBOX_NET_LEASE_DIR,
      blockedCidrs: e.ROLLBOX_NET_BLOCK.split(',').map((c) => c.trim()).filter(Boolean),
      staticHosts: new Map(
        e.ROLLBOX_NET_STATIC_HOSTS.split(',')
          .map((entry) => entry.trim().split('='))
          .filter((kv): kv is [string, string] => kv.length === 2 && !!kv[0])
          .map(([name, ips]) => [name.toLowerCase(), ips.split('|').filter(Boolean)]),
      ),
    },
  };
}

function parseList(value: string): string[] {
  return value.split(',').map((s) => s.trim()).filter(Boolean);
}

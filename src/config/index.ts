// Longer than most: the one env schema every role parses once, kept whole so each variable's
// default and description are read (and documented by `npm run docs`) in one place.
import { z } from 'zod';
import os from 'node:os';
import path from 'node:path';
import { RunCodeLanguage } from '../api/run-code.ts';
import { NetworkAllowRule, PauseMode } from '../api/sandbox.ts';
import { registryHostOf } from '../oci-registry/index.ts';
import { parseRedisTarget } from '../redis/connect.ts';

/** What `POST /run_code` runs without ROLLBOX_RUN_CODE_LANGUAGES: a `python` layer the operator registers, and the base image's shell. */
const DEFAULT_RUN_CODE_LANGUAGES = {
  python: { image: { base: 'python', layers: [] }, argv: ['python3'], file: 'main.py', memoryMiB: 512 },
  bash: { image: { base: 'busybox', layers: [] }, argv: ['sh'], file: 'main.sh', memoryMiB: 512 },
};

/** REDIS_URL: one Redis as any URL, or a `redis+cluster://` node list (parseRedisTarget says what is wrong with one). */
function checkRedisUrl(value: string, ctx: z.RefinementCtx): void {
  try {
    if (parseRedisTarget(value).kind === 'single') new URL(value);
  } catch (err) {
    ctx.addIssue({ code: 'custom', message: err instanceof TypeError ? 'Invalid URL' : (err as Error).message });
  }
}

/**
 * The one environment schema. `loadConfig` is called once by the composition root
 * (the CLI); everything else receives the parsed `Config` (or the slice it needs).
 */
/**
 * Every variable, its default and what it means; docs/configuration.md is generated from
 * the descriptions here (`npm run docs`; a unit test fails when it drifts).
 */
export const Env = z.object({
  REDIS_URL: z.string().superRefine(checkRedisUrl).optional().describe('Redis shared by every gateway and worker host: `redis://[user:password@]host:port`, or a Redis Cluster by some of its nodes: `redis+cluster://[user:password@]host:port,host:port,...`. Unset: `rollbox up` starts its own redis-server.'),
  ROLLBOX_DATA_DIR: z.string().default('./.rollbox').describe('Data dir (`--data-dir`): layer store, worker state, embedded Redis, JWT secret.'),
  ROLLBOX_PORT: z.coerce.number().int().min(0).max(65_535).default(8080).describe('Gateway port (`--port`).'),
  ROLLBOX_HOST: z.string().default('127.0.0.1').describe('Gateway listen address.'),
  ROLLBOX_NODE_ID: z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/).optional().describe('Worker host identity (`--node-id`). Unset: generated once and kept in the data dir, so a restart adopts its sandboxes.'),
  ROLLBOX_POOL: z.string().regex(/^[a-z0-9-]{1,32}$/).default('local').describe('Worker host pool: `local`, or `cloud` for burst hosts.'),
  ROLLBOX_START_CHECKS: z.enum(['fail', 'warn']).default('fail').describe('Worker: what a missing capability, device, cgroup access or seccomp permission that every sandbox needs does at start: `fail` (exit naming each) or `warn` (log each and start anyway; for finding what a container really needs).'),
  ROLLBOX_MICROVM: z.enum(['auto', 'off']).default('auto').describe('Worker: the microVM tier (docs/microvm.md). `auto`: on where QEMU and the guest kernel (scripts/install-microvm.sh) are present; `off`: creates with `tier: microvm` are refused here.'),
  ROLLBOX_QEMU: z.string().default('qemu-system-x86_64').describe('Worker: the QEMU binary of the microVM tier.'),
  ROLLBOX_VM_KERNEL: z.string().optional().describe('Worker: the microVM guest kernel. Default: `build/vm/vmlinuz` (Debian\'s cloud kernel, unpacked by scripts/install-microvm.sh).'),
  ROLLBOX_VM_INITRAMFS: z.string().optional().describe('Worker: the microVM guest initramfs. Default: `build/vm/initramfs.cpio.gz` (scripts/build-vminit.sh).'),
  ROLLBOX_VM_ACCEL: z.enum(['auto', 'kvm', 'tcg']).default('auto').describe('Worker: the microVM accelerator. `auto`: kvm where /dev/kvm is usable and the CPU has vmx or svm (a PVM /dev/kvm boots no standard guest), else tcg.'),
  ROLLBOX_VM_RAM_DIR: z.string().default('/dev/shm').describe('Worker: the tmpfs holding each microVM\'s guest RAM as a shared file (charged to the VM\'s cgroup), so a hibernation saves the RAM by copying that file, not through QEMU\'s migration stream.'),
  ROLLBOX_VM_BOOT_TIMEOUT_MS: z.coerce.number().int().min(1000).default(60_000).describe('Worker: from QEMU\'s start until the guest\'s init answers; past it the create fails.'),
  ROLLBOX_VM_RETURN_MEMORY: z.enum(['on', 'off']).default('on').describe('Worker: microVM guests hand back memory they do not use (docs/microvm.md, "Memory the host gets back"): `on` gives each new VM a virtio-balloon device for free page reporting from 128 KiB blocks (QEMU punches reported pages out of the RAM file), has its guest reclaim its cold page cache (ROLLBOX_VM_CACHE_RECLAIM_SECONDS) and, under TCG, a 32 MiB translation buffer instead of 64; `off`: a VM holds every page its guest ever touched.'),
  ROLLBOX_VM_CACHE_RECLAIM_SECONDS: z.coerce.number().int().min(0).max(3600).default(10).describe('Worker, with ROLLBOX_VM_RETURN_MEMORY=on: every this many seconds the guest reclaims the page cache its LRU lists as inactive (cold), so it becomes free pages to report; 0: only free pages are reported.'),
  ROLLBOX_VM_SNAPSHOT_IDLE_MS: z.coerce.number().int().min(100).default(30_000).describe('Worker: a microVM snapshot whose guest sends nothing for this long (its stream stopped) is given up: `snapshot_failed`, nothing stored, the VM runs on.'),
  ROLLBOX_RUNTIME: z.string().default('runc').describe('OCI runtime binary (crun refuses hybrid cgroups with a controller on the cgroup2 mount).'),
  ROLLBOX_LAYER_STORE: z.string().optional().describe('Shared, content-addressed layer store (a shared filesystem across machines). Default: `<data dir>/layers`.'),
  ROLLBOX_LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info').describe('pino log level.'),

  ROLLBOX_JWT_ALG: z.enum(['HS256', 'EdDSA', 'ES256']).default('HS256').describe('Token algorithm: `HS256` (a secret file), `EdDSA` or `ES256` (a public key or a JWKS URL).'),
  ROLLBOX_JWT_SECRET_FILE: z.string().optional().describe('HS256 secret file; created with a random secret when absent. Default: `<data dir>/jwt-secret`.'),
  ROLLBOX_JWT_PUBLIC_KEY_FILE: z.string().optional().describe('PEM public key (SPKI) for EdDSA/ES256.'),
  ROLLBOX_JWKS_URL: z.string().url().optional().describe('JWKS endpoint for EdDSA/ES256 (instead of a key file).'),
  ROLLBOX_JWT_ISSUER: z.string().default('rollbox').describe('Required `iss` of tokens.'),
  ROLLBOX_JWT_AUDIENCE: z.string().default('rollbox-api').describe('Required `aud` of tokens.'),
  ROLLBOX_JWT_CLOCK_TOLERANCE_SEC: z.coerce.number().int().min(0).max(300).default(5).describe('Clock skew tolerated on `exp`/`nbf`.'),

  ROLLBOX_TENANT_MAX_SANDBOXES: z.coerce.number().int().min(1).default(1000).describe('Live sandboxes per tenant (429 `quota_exceeded` past it).'),
  ROLLBOX_BODY_LIMIT_BYTES: z.coerce.number().int().min(1024).default(16 * 1024 * 1024).describe('JSON body cap (413 past it).'),
  ROLLBOX_LAYER_BUILD: z.enum(['direct', 'extract']).default('direct').describe('Gateway: how a layer tar (an upload, an imported or pulled image layer) becomes an EROFS layer: `direct` writes the metadata image and data blob from the tar stream, nothing extracted, each byte written once; `extract` extracts the tree first and runs mkfs.erofs on it (every byte written twice, unless a pull extracts on ROLLBOX_IMAGE_PULL_MEMORY_DIR). Both give the same files.'),
  ROLLBOX_LAYER_UPLOAD_LIMIT_BYTES: z.coerce.number().int().min(1024).default(2 * 1024 * 1024 * 1024).describe('Largest layer tar `POST /v1/layers` takes (413 past it).'),
  ROLLBOX_LAYER_BLOB_GZIP_LEVEL: z.coerce.number().int().min(0).max(9).default(1).describe('Gateway: gzip level of the chunk ranges it serves to hosts reading lazy layers (`GET /v1/layers/:digest/blob` with `Range` and `Accept-Encoding: gzip`): fewer bytes on the link for some CPU. 0: sent as stored.'),
  ROLLBOX_LAYER_MAX_ENTRIES: z.coerce.number().int().min(1000).max(16_000_000).default(2_000_000).describe('Gateway: most entries one layer tar may hold (an upload, an imported or pulled image layer): 413 `payload_too_large` past it. A build keeps about 110 bytes per entry plus its name in memory (docs/operations.md).'),
  ROLLBOX_LAYER_READS_MAX: z.coerce.number().int().min(1).max(4096).default(64).describe('Gateway: layer file reads (`GET /v1/layers/:ref/blob` and `/meta`, ranged or whole: hosts\' lazy fetches, downloads) streaming at once; each holds about two 1 MiB pieces. Past it a read waits (ROLLBOX_LAYER_READS_QUEUE_MS), then 503 `unavailable` with Retry-After (hosts retry).'),
  ROLLBOX_LAYER_READS_PER_TOKEN: z.coerce.number().int().min(1).max(4096).default(16).describe('Gateway: of those, at most this many for one token (a host fetches at most ROLLBOX_LAZY_FETCH_CONCURRENCY + 1 at once).'),
  ROLLBOX_LAYER_READS_QUEUE_MS: z.coerce.number().int().min(0).max(600_000).default(5_000).describe('Gateway: how long a layer read past the caps waits for a slot before its 503.'),
  ROLLBOX_PLACEMENT_CHOICES: z.coerce.number().int().min(1).max(16).default(2).describe('Placement: d, the nodes sampled per create (the less loaded one is taken).'),
  ROLLBOX_PLACEMENT_MAX_REFUSALS: z.coerce.number().int().min(1).max(64).default(3).describe('Placement: node refusals before a create fails 503 `admission_exhausted` with Retry-After.'),
  ROLLBOX_CREATE_TIMEOUT_MS: z.coerce.number().int().min(100).default(60_000).describe('How long a create may wait for a node to start it.'),

  ROLLBOX_NODE_MEMORY_MIB: z.coerce.number().int().min(64).optional().describe('Worker: memory it promises to sandboxes (the sum of their memory requests). Default: 85% of the host\'s x `ROLLBOX_NODE_MEMORY_OVERCOMMIT`.'),
  ROLLBOX_NODE_MEMORY_OVERCOMMIT: z.coerce.number().min(1).max(64).default(1).describe('Worker: memory requests promised past 85% of the host\'s memory (requests are what sandboxes reserve, not their limits; real pressure is watched too, see `ROLLBOX_NODE_PSI_MEMORY_MAX`).'),
  ROLLBOX_NODE_PSI_MEMORY_MAX: z.coerce.number().min(0).max(100).default(10).describe('Worker: no new sandbox while `/proc/pressure/memory` says every task was stalled on memory more than this % of the last 10 s (`full avg10`); 0 turns it off.'),
  ROLLBOX_NODE_PSI_CPU_MAX: z.coerce.number().min(0).max(100).default(0).describe('Worker: no new sandbox while some task waited for CPU more than this % of the last 10 s (`/proc/pressure/cpu` `some avg10`); 0 (default) turns it off: on a small host under a burst of work it is near 100% without harm.'),
  ROLLBOX_DEFAULT_REQUEST_MEMORY_MIB: z.coerce.number().int().min(1).default(64).describe('Gateway: memory a sandbox reserves when its create gives no `resources.requests.memoryMiB` (never above its limit).'),
  ROLLBOX_DEFAULT_REQUEST_CPU_MILLIS: z.coerce.number().int().min(1).default(100).describe('Gateway: CPU a sandbox reserves when its create gives no `resources.requests.cpuMillis` (never above its limit).'),
  ROLLBOX_NODE_CPU_MILLIS: z.coerce.number().int().min(100).optional().describe('Worker: CPU it promises to sandboxes. Default: cores x 1000 x `ROLLBOX_NODE_CPU_OVERCOMMIT`.'),
  ROLLBOX_NODE_CPU_OVERCOMMIT: z.coerce.number().min(1).max(64).default(8).describe('Worker: CPU promised past physical capacity (idle agents use little; DSec oversubscribes them).'),
  ROLLBOX_NODE_MAX_SANDBOXES: z.coerce.number().int().min(1).default(2000).describe('Worker: sandboxes at most.'),
  ROLLBOX_NODE_DISK_OVERCOMMIT: z.coerce.number().min(1).max(1000).default(8).describe('Worker: sum of `diskMiB` promised, as a multiple of the scratch space (disks are sparse; 1 with preallocated disks).'),
  ROLLBOX_NODE_SCRATCH_FS: z.enum(['xfs', 'ext4']).default('xfs').describe('Worker: filesystem of the scratch image holding sandbox disks. xfs clones disks (forks start children without copying or packing the files of the parent); ext4 cannot (forks pack a layer first). Sandbox disks are ext4 either way; a host changes type when its scratch filesystem is next made (no disk in it).'),
  ROLLBOX_SWAP_FILE_MIB: z.coerce.number().int().min(0).default(0).describe('Worker: size of the swap file paused sandboxes are paged out to (pause mode `swap`), made and enabled at the first swap pause, removed when the worker stops and destroys its sandboxes (kept across a restart that leaves them running). 0: no swap pauses here (refused `swap_unavailable`). Each sandbox\'s swap is capped at its memoryMiB.'),
  ROLLBOX_SWAP_FILE: z.string().optional().describe('Worker: where that swap file lives, on a filesystem that takes swap files (ext4, XFS; not tmpfs or overlayfs). Default: `<data dir>/worker/swapfile`.'),
  ROLLBOX_NODE_SCRATCH_GIB: z.coerce.number().positive().optional().describe('Worker: size of the scratch filesystem holding sandbox disks. Default: half the free space under the data dir, at most 64.'),
  ROLLBOX_NODE_IDLE_UNMOUNT_MS: z.coerce.number().int().min(0).default(10_000).describe('Worker: how long the scratch filesystem and a layer stay mounted after the last sandbox using them goes (mounting them again costs one-shot sandboxes ~100 ms each).'),
  ROLLBOX_NODE_MAX_STARTING: z.coerce.number().int().min(1).default(16).describe('Worker: creates at once (the concurrency of its BullMQ Worker); the rest wait in its create queue.'),
  ROLLBOX_POOL_REFILL_CONCURRENCY: z.coerce.number().int().min(1).max(64).default(2).describe('Worker: warm-pool sandboxes it starts at once (under SCHED_IDLE, so running work is not slowed).'),
  ROLLBOX_NODE_HOST_RESERVE_MIB: z.coerce.number().int().min(0).default(256).describe('Worker: host memory kept free for the host itself; below it, new sandboxes are refused.'),
  ROLLBOX_HEARTBEAT_MS: z.coerce.number().int().min(50).default(1000).describe('Worker heartbeat interval.'),
  ROLLBOX_NODE_AUDIT_MS: z.coerce.number().int().min(1000).default(60_000).describe('Worker: the safety net behind its events (an init\'s death, a TTL, a delete): every sandbox is checked against /proc once per this interval, spread evenly over it, and the host\'s sandboxes are compared with the registry (two Redis calls) once per interval. An idle host does nothing else per sandbox.'),
  ROLLBOX_NODE_STALE_AFTER_MS: z.coerce.number().int().min(200).default(5000).describe('A worker whose heartbeat is this old gets no new work: placement passes it by, and creates waiting on it are placed elsewhere. At most ROLLBOX_NODE_LOST_AFTER_MS.'),
  ROLLBOX_NODE_LOST_AFTER_MS: z.coerce.number().int().min(200).default(30_000).describe('A worker whose heartbeat is this old is lost: its sandboxes end `failed(lost)` and its unfinished commands `result_unknown`. A worker of that node back sooner (a restart, a crash and a restart) adopts its sandboxes, and their commands, which ran on meanwhile (ROLLBOX_COMMAND_GRACE_MS), are collected: keep it above the time a worker takes to come back.'),
  ROLLBOX_COMMAND_GRACE_MS: z.coerce.number().int().min(0).max(24 * 3600 * 1000).default(60_000).describe('Worker: how long a command outlives its worker host\'s process (a crash or restart) in the sandbox\'s init, running on with its output and exit status kept, for the next worker to collect; past it the init kills it (or drops its result) and the command ends `result_unknown`. 0: commands die with their worker.'),
  ROLLBOX_EXEC_OUTPUT_CAP_BYTES: z.coerce.number().int().min(1024).default(1024 * 1024).describe('stdout and stderr kept per command, each (`truncated: true` past it; the rest is drained and dropped in the sandbox).'),
  ROLLBOX_BESTEFFORT_HOLD_MS: z.coerce.number().int().min(0).default(10_000).describe('How long one command a caller waits on, in a latency sandbox, may hold the host\'s besteffort sandboxes at `ROLLBOX_BESTEFFORT_HELD_CPU_MILLIS` (the besteffort guard, a stand-in for core scheduling); 0 turns the guard off.'),
  ROLLBOX_BESTEFFORT_HELD_CPU_MILLIS: z.coerce.number().int().min(10).max(100_000).default(10).describe('CPU each besteffort sandbox keeps while held, millicores (10 = 1 ms per 100 ms, the kernel\'s least).'),
  ROLLBOX_FILES_MAX_BYTES: z.coerce.number().int().min(1024).max(512 * 1024 * 1024).default(64 * 1024 * 1024).describe('Largest file or tar one `/files` request moves (it travels through Redis; 413 past it).'),
  ROLLBOX_LAYER_GC_GRACE_MS: z.coerce.number().int().min(0).default(10 * 60_000).describe('A layer nothing references is collected once unreferenced this long.'),
  ROLLBOX_LAYER_GC_INTERVAL_MS: z.coerce.number().int().min(100).default(60_000).describe('How often the gateways\' janitor looks for unreferenced layers.'),

  ROLLBOX_REGISTRY_AUTH_FILE: z.string().optional().describe('Gateway: a Docker `config.json` whose `auths` give image pulls their registry credentials (`auth`: base64 of `user:password`, or `username` and `password`), read at each pull. Unset: pulls are anonymous.'),
  ROLLBOX_REGISTRY_INSECURE: z.string().default('').describe('Gateway: registries (`host[:port]`, comma-separated) image pulls speak plain HTTP to; every other registry is HTTPS only.'),
  ROLLBOX_REGISTRY_MIRRORS: z.string().default('').describe('Gateway: `registry=URL|URL,...` mirrors image pulls try first, in order, before the registry itself (`docker.io=http://127.0.0.1:5000`: a pull-through cache of Docker Hub; the URL\'s scheme is used as written).'),
  ROLLBOX_REGISTRY_TIMEOUT_MS: z.coerce.number().int().min(100).default(30_000).describe('Gateway: longest wait for a registry during a pull (an answer, or the next bytes of a blob); past it the pull fails `registry_unavailable`.'),
  ROLLBOX_REGISTRY_ALLOW: z.string().default('').describe('Gateway: the only registries (`host[:port]`, comma-separated; a bare host allows each of its ports) image pulls may name; others are refused at the request, `registry_not_allowed`. Mirrors and a registry\'s redirects are not held to it (a blob store\'s host is the registry\'s choice); they are held to ROLLBOX_REGISTRY_INTERNAL. Empty: any registry.'),
  ROLLBOX_REGISTRY_INTERNAL: z.string().default('').describe('Gateway: hosts (`host[:port]`, comma-separated; a bare host allows each of its ports) image pulls may reach on loopback, link-local or private addresses: registries, mirrors, their redirect targets and token realms, each checked at every hop on the addresses it resolves to. Any other destination at such an address is refused (`registry_not_allowed`), so a registry cannot send the gateway to its own API, Redis or a cloud metadata service.'),
  ROLLBOX_IMAGE_PULL_DEADLINE_MS: z.coerce.number().int().min(1000).default(2 * 3600_000).describe('Gateway: the longest an image pull may run, from its start (a pull taken over by another gateway keeps its start); past it the pull ends `failed`, `image_pull_timeout`, nothing of it stored.'),
  ROLLBOX_IMAGE_PULL_MIN_BYTES_PER_S: z.coerce.number().int().min(0).default(1024).describe('Gateway: the slowest a registry may send a body a pull is waiting for (a manifest, config, token or layer blob), measured over each ROLLBOX_IMAGE_PULL_RATE_WINDOW_MS in which the pull waited for it throughout; slower fails the pull `registry_unavailable` (a registry trickling a byte every few seconds never trips ROLLBOX_REGISTRY_TIMEOUT_MS). 0: no floor.'),
  ROLLBOX_IMAGE_PULL_RATE_WINDOW_MS: z.coerce.number().int().min(100).default(60_000).describe('Gateway: the window ROLLBOX_IMAGE_PULL_MIN_BYTES_PER_S is measured over.'),
  ROLLBOX_IMAGE_PULL_LAYERS: z.coerce.number().int().min(1).max(16).default(3).describe('Gateway: layer blobs one image pull fetches (and extracts) at once.'),
  ROLLBOX_IMAGE_PULL_WAIT_MS: z.coerce.number().int().min(100).default(15 * 60_000).describe('Gateway: how long a create whose `image.ref` is not held yet waits for its pull (then 504 `image_pull_timeout`; the pull goes on).'),
  ROLLBOX_IMAGE_PULL_MEMORY_MIB: z.coerce.number().int().min(0).optional().describe('Gateway, with ROLLBOX_LAYER_BUILD=extract: room on a tmpfs (ROLLBOX_IMAGE_PULL_MEMORY_DIR) for the extracted trees of layers being pulled, so each pulled layer reaches the disk once, as its EROFS image (0: every tree on disk, written twice). Default: an eighth of the host\'s memory, at most 2048. A layer whose tree outgrows its reservation (4x a compressed blob) is fetched again and built on disk.'),
  ROLLBOX_IMAGE_PULL_MEMORY_DIR: z.string().default('/dev/shm').describe('Gateway: the tmpfs pulled layers\' trees are extracted into (not a tmpfs, or too full: on disk).'),
  ROLLBOX_IMAGE_PULL_LEASE_MS: z.coerce.number().int().min(500).default(15_000).describe('Gateway: a running image pull\'s lease, renewed every third of it; a pull whose gateway stopped renewing is taken over by another gateway (or the same one restarted).'),

  ROLLBOX_SYNC_LAYERS: z.string().optional().describe('Worker: layers (names or digests, or imported images\' names, comma-separated) copied into its own store before it reports ready; `cluster` = the cluster\'s pre-synced set. Default: `cluster` in pool `cloud`, none elsewhere.'),
  ROLLBOX_GATEWAY_URL: z.string().url().optional().describe('Worker: the gateway it fetches the layers its own store lacks from (a host that shares no layer store with the cluster: a cloud host, a host with its own data dir). Without it, such a host can run only what its store holds.'),
  ROLLBOX_GATEWAY_TOKEN: z.string().optional().describe('Worker: a token with layer read scope for that gateway.'),
  ROLLBOX_LAYER_FETCH: z.enum(['lazy', 'full']).default('lazy').describe('Worker (with `ROLLBOX_GATEWAY_URL`): how a layer its store lacks gets here: `lazy` (its metadata fetched, the sandbox started, data chunks fetched as they are first read into the host\'s chunk cache) or `full` (the whole layer copied into the store before the sandbox starts). Single-image layers are always copied whole.'),
  ROLLBOX_LAYER_CACHE_MAX_MIB: z.coerce.number().int().min(1).optional().describe('Worker: size of the chunk cache of lazy layers. Past it, the data of the least recently used layers no sandbox mounts is removed; a sandbox whose lazy layers could not fit (each mounted layer counted at its whole size) is refused. Default: a quarter of the data dir\'s filesystem, at most 64 GiB.'),
  ROLLBOX_LAZY_GRACE_MS: z.coerce.number().int().min(0).default(10_000).describe('Worker: how long reads of lazy layers wait for chunks while the worker (their fetcher) is gone, e.g. restarting, before they fail with EIO.'),
  ROLLBOX_LAZY_READ_TIMEOUT_MS: z.coerce.number().int().min(1000).default(120_000).describe('Worker: the longest one read of a lazy layer waits for its chunks before it fails with EIO.'),
  ROLLBOX_LAZY_FETCH_TIMEOUT_MS: z.coerce.number().int().min(100).default(30_000).describe('Worker: deadline of one request for a lazy layer\'s files at the origin (a range of chunks, its chunk table, its metadata image); past it the reads waiting on it fail with EIO (a mount, its create).'),
  ROLLBOX_LAZY_FETCH_CONCURRENCY: z.coerce.number().int().min(1).max(64).default(8).describe('Worker: range requests for chunks at once.'),
  ROLLBOX_LAZY_PREFETCH: z.enum(['off', 'record', 'on']).default('on').describe('Worker: prefetch lists of lazy layers: `record` notes which chunks the first runs of a layer read (during `ROLLBOX_LAZY_PREFETCH_WINDOW_MS` from its first read on any lazy host), `on` also fills a layer\'s list in the background when it is mounted, and at a cloud host\'s pre-sync; `off` neither.'),
  ROLLBOX_LAZY_PREFETCH_WINDOW_MS: z.coerce.number().int().min(1000).default(120_000).describe('Worker: how long a host\'s first run of a lazy layer (mounted with none of it cached) records the chunks it reads, from the mount.'),
  ROLLBOX_LAZY_PREFETCH_RUNS: z.coerce.number().int().min(1).max(1000).default(8).describe('Worker: how many first runs of a lazy layer (on any hosts) are recorded; its prefetch list is the chunks more than half of them read.'),
  ROLLBOX_LAZY_READAHEAD_CHUNKS: z.coerce.number().int().min(0).max(16).default(0).describe('Worker: at most this many chunks fetched past a read of a lazy layer that continues the one before (1, 2, 4... as the run goes on); 0 (the default: in bench:lazy 4 fetched 0.31 of the images against 0.24 and finished no sooner): only the chunks reads ask for.'),
  ROLLBOX_BURST_SYNC_LAYERS: z.string().default('busybox').describe('Gateway: the cluster\'s pre-synced layer set (layer names or digests, or imported images\' names for all their layers; comma-separated); only creates within it may burst to the cloud.'),
  ROLLBOX_BURST_PROVIDER: z.enum(['none', 'local', 'command']).default('none').describe('Gateway: how cloud hosts are started: `none` (operators run them), `local` (processes here, for demos and tests), `command` (operator programs).'),
  ROLLBOX_BURST_PROVISION_CMD: z.string().optional().describe('Provider `command`: the program that starts a cloud host (JSON on stdin and stdout; see docs/burst.md).'),
  ROLLBOX_BURST_TERMINATE_CMD: z.string().optional().describe('Provider `command`: the program that ends a cloud host (idempotent).'),
  ROLLBOX_BURST_LIST_CMD: z.string().optional().describe('Provider `command`: the program that lists cloud hosts.'),
  ROLLBOX_BURST_CMD_TIMEOUT_MS: z.coerce.number().int().min(100).default(60_000).describe('Provider `command`: how long one program may take.'),
  ROLLBOX_BURST_TICK_MS: z.coerce.number().int().min(50).default(1000).describe('Burst controller tick.'),
  ROLLBOX_BURST_GATEWAY_URL: z.string().url().optional().describe('The gateway URL cloud hosts use. Default: the gateway\'s own URL.'),
  ROLLBOX_BURST_TRACE_MAX_EVENTS: z.coerce.number().int().min(0).default(1_000_000).describe('Create events kept in the trace stream (`rollbox burst record` exports them); 0 turns recording off.'),
  ROLLBOX_CAPACITY_SAFE_PER_NODE: z.coerce.number().positive().optional().describe('Gateway: sandboxes one worker host carries safely, for the console\'s capacity figures (`GET /v1/cluster/capacity`). Unset: the most one node held in a 10 s bucket without a capacity refusal.'),
  ROLLBOX_CAPACITY_HEADROOM: z.coerce.number().min(1).max(10).default(1.25).describe('Gateway: capacity kept above the estimated concurrency when the console computes nodes needed.'),
  ROLLBOX_CAPACITY_WINDOW_SECONDS: z.coerce.number().int().min(10).max(10_800).default(300).describe('Gateway: the window of the capacity gauges in /metrics (`rollbox_capacity_*`).'),
  ROLLBOX_SIGNALS_FLUSH_MS: z.coerce.number().int().min(100).max(60_000).default(1000).describe('Gateway: how often it writes what it counted for the console (creates, waits, exec times, batch tasks) to Redis; nothing is written while there is nothing new.'),
  ROLLBOX_PORT_RELAY_LISTEN: z.string().regex(/^(\[[0-9a-fA-F:.]+\]|[^:\s]+):\d{1,5}$/, 'host:port').default('127.0.0.1:0').describe('Worker: where its port relay listens (`host:port`; port 0: any free one), the door gateways dial for traffic into its sandboxes\' ports (`/v1/sandboxes/:id/ports/:port/...`, E2B `getHost`). Each connection needs a ticket only a gateway can sign. On a cluster of several machines, an address the gateways reach.'),
  ROLLBOX_PORT_RELAY_ADDRESS: z.string().regex(/^(\[[0-9a-fA-F:.]+\]|[^:\s]+):\d{1,5}$/, 'host:port').optional().describe('Worker: the address gateways dial for its port relay (behind NAT, or listening on 0.0.0.0). Default: the listen address with its port.'),
  ROLLBOX_E2B_DOMAIN: z.string().regex(/^[a-z0-9.-]+(:\d{1,5})?$/).optional().describe('Gateway: the domain E2B sandboxes answer with, so `getHost(port)` is `<port>-<sandbox id>.<domain>` (a name that resolves to the gateway, a wildcard DNS entry; it may carry a `:port`). The gateway routes a request by such a Host header into that port of the sandbox. Default: `localhost:<gateway port>` (names under `localhost` reach the machine itself in browsers and curl).'),
  ROLLBOX_SANDBOX_GATEWAY_URL: z
    .string()
    .refine((v) => v.split(',').every((u) => URL.canParse(u.trim())), 'a comma-separated list of URLs')
    .optional()
    .describe('Worker: the gateways as this host reaches them, for sandboxes whose network has `gateway: true` (hosted rollouts\' agent sandboxes): the host\'s kernel sends their `http://gateway.rollbox.internal:9180` there (a DNAT rule: bytes pass unchanged, so `http://` URLs; a host name is resolved to IPv4 by the worker). Comma-separated: the rule names the first that accepts a connection, in an order of the host\'s own (the list rotated by a hash of its node id, so many hosts spread over the gateways), checked each second while the host has such sandboxes (an agent\'s retry of a call whose gateway died reaches the next, which joins or takes over the call). The rule holds while the worker is down. Default: `ROLLBOX_GATEWAY_URL` when it is one; `rollbox up` uses its own gateway. Without either, such sandboxes are refused here (`network_unavailable`).'),
  ROLLBOX_NET_POOL: z.string().default('10.200.0.0/16').describe('Veth addresses of allowlist sandboxes, one /30 each; shared by the workers of a host.'),
  ROLLBOX_NET_LEASE_DIR: z.string().default('/run/rollbox/net').describe('Host-wide address leases of that pool (one file per /30).'),
  ROLLBOX_NET_BLOCK: z.string().default('').describe('More CIDRs no sandbox may reach (comma-separated), on top of the built-in list.'),
  ROLLBOX_NET_PROBE_CIDR: z.string().default('198.18.0.0/15').describe('Worker: addresses of the network self-test\'s probe "outside" (a /29 per worker host, inside a namespace of its own; the RFC 2544 benchmarking range, never routed).'),
  ROLLBOX_NET_SELFTEST_INTERVAL_MS: z.coerce.number().int().min(1000).default(60_000).describe('Worker: how often the network self-test runs (also at start); while it fails, every 5 s at most this. Allowlist creates go only to hosts where it passes.'),
  ROLLBOX_RUN_CODE_LANGUAGES: z
    .string()
    .default('')
    .describe('Gateway: JSON `{"language": {"image": {"base": "...", "layers": [...]}, "argv": ["python3"], "file": "main.py", "memoryMiB": 512}}` for `POST /run_code`, over the defaults (python: layer `python`, `python3 main.py`; bash: `busybox`, `sh main.sh`).'),
  ROLLBOX_BUILD_SLOTS: z.coerce.number().int().min(0).default(2).describe('Gateway: image builds this gateway runs at once (0: it runs none; other gateways do).'),
  ROLLBOX_BUILD_LEASE_MS: z.coerce.number().int().min(1000).default(30_000).describe('Gateway: the BullMQ lock of a running image build, renewed while it runs; a build whose gateway died is taken over about this long later and runs again from its cached steps.'),
  ROLLBOX_BUILD_NETWORK_ALLOW: z.string().default('').describe('Gateway: destinations every image build\'s RUN steps may reach, with those of the request (`network.allow`): comma-separated `host`, `address` or `cidr`, each optionally `:port`. Empty, and none in the request: RUN steps have no network.'),
  ROLLBOX_BUILD_CONTEXT_MAX_BYTES: z.coerce.number().int().min(1024).default(256 * 1024 * 1024).describe('Gateway: the largest build context tar (`POST /v1/images/builds/contexts`); it is held in Redis until ROLLBOX_BUILD_CONTEXT_TTL_MS. What one COPY writes is also held to ROLLBOX_FILES_MAX_BYTES.'),
  ROLLBOX_BUILD_CONTEXT_TTL_MS: z.coerce.number().int().min(1000).default(3600_000).describe('Gateway: how long an uploaded build context is kept for builds to name.'),
  ROLLBOX_BUILD_CACHE_TTL_MS: z.coerce.number().int().min(1000).default(7 * 24 * 3600_000).describe('Gateway: a cached build step\'s layer is kept (safe from layer garbage collection) this long after a build last used it.'),
  ROLLBOX_BATCH_SLOTS: z.coerce.number().int().min(0).default(8).describe('Gateway: batch tasks this gateway runs at once (over every batch; 0: it runs none).'),
  ROLLBOX_BATCH_LEASE_MS: z.coerce.number().int().min(1000).default(10_000).describe('Gateway: the BullMQ lock of a running batch task\'s job, renewed every third of it; the stalled check runs as often, so a gateway that dies has its tasks waiting again about this long plus two checks later (BullMQ\'s default is 30 s).'),
  ROLLBOX_BATCH_MAX_BYTES: z.coerce.number().int().min(1024).default(512 * 1024 * 1024).describe('Gateway: the largest NDJSON batch body.'),
  ROLLBOX_BATCH_TENANT_WEIGHTS: z.string().default('').describe('Gateway: `tenant=weight,...`: relative shares of batch capacity (default 1 each).'),
  ROLLBOX_MODEL_MAX_HOLD_MS: z.coerce.number().int().min(100).default(30 * 60_000).describe('Gateway: the longest a model call is held (its job paused, its upstreams unreachable or not registered) before it fails `model_hold_expired` in the SDK\'s error shape (a rollout\'s wall time may end it sooner).'),
  ROLLBOX_MODEL_KEEPALIVE_MS: z.coerce.number().int().min(50).default(10_000).describe('Gateway: while a model call is held or its upstream is silent, what the agent gets this often: an SSE comment (`: keepalive`), an Anthropic `ping` event, or a space after an early 200 for calls that do not stream.'),
  ROLLBOX_MODEL_EARLY_HEADERS_MS: z.coerce.number().int().min(0).default(2000).describe('Gateway: a held model call that does not stream answers 200 once it is this old (then spaces until its body), so its SDK\'s timeout, which covers only the wait for headers, does not fire; a held streaming call answers 200 at once. Until then a retry of it joins it.'),
  ROLLBOX_MODEL_LEASE_MS: z.coerce.number().int().min(200).default(3000).describe('Gateway: a model call in flight is owned by its gateway under this lease, renewed every third of it; a retry (or the sweeper) on another gateway takes over a call whose owner stopped renewing and re-issues it, recorded once.'),
  ROLLBOX_MODEL_RETRY_JOIN_SECONDS: z.coerce.number().int().min(0).default(600).describe('Gateway: how long after a model call ended a client retry of it (same rollout and body, `x-stainless-retry-count` > 0) gets its answer again instead of making a new call.'),
  ROLLBOX_MODEL_RECORD_TTL_SECONDS: z.coerce.number().int().min(60).default(7 * 24 * 3600).describe('Gateway: how long model call records (and their rollout\'s counters) are kept.'),
  ROLLBOX_MODEL_CONNECT_TIMEOUT_MS: z.coerce.number().int().min(50).default(5000).describe('Gateway: the longest a model upstream may take to accept a connection; past it the upstream counts as unreachable (the next one is tried, or the call held).'),
  ROLLBOX_MODEL_PROBE_MS: z.coerce.number().int().min(20).default(1000).describe('Gateway: while a job\'s upstreams are unreachable, how often the first held call tries them again.'),
  ROLLBOX_MODEL_MAX_REISSUES: z.coerce.number().int().min(0).max(100).default(5).describe('Gateway: re-issues of one model call whose answer was cut short before it fails `model_upstream_failed`.'),
  ROLLBOX_E2B_PAUSE_MODE: PauseMode.default('freeze').describe('Gateway: how E2B\'s pause (memory kept) and auto-pause (`lifecycle.onTimeout: pause`) pause a sandbox: `freeze` (cgroup freezer: memory and processes stay on the host), or another pause mode of `POST /v1/sandboxes/:id/pause`. E2B\'s pause without memory hibernates.'),
  ROLLBOX_E2B_PAUSED_TTL_SECONDS: z.coerce.number().int().min(1).max(7 * 24 * 3600).default(24 * 3600).describe('Gateway: how long an E2B sandbox is kept paused (paused by `pause()` or at its timeout) before it ends; `connect` resumes it meanwhile. E2B documents 30 days; a frozen sandbox holds its memory on its host all that time.'),
  ROLLBOX_E2B_BASE_TEMPLATE: z.enum(['first-use', 'start', 'off']).default('first-use').describe('Gateway: E2B\'s `base` template, a Debian image with bash, git, python3, curl and sudo built by debootstrap once per cluster (docs/e2b.md): built at the first create that asks for it (`first-use`), as the gateway starts (`start`), or never (`off`: `base` is busybox).'),
  ROLLBOX_E2B_BASE_TEMPLATE_WAIT_MS: z.coerce.number().int().min(0).max(10 * 60_000).default(45_000).describe('Gateway: how long a create of `base` waits for the template\'s build before it answers 503 `template_not_ready` with how far the build is (under the SDK\'s 60 s request timeout).'),
  ROLLBOX_E2B_BASE_SUITE: z.string().regex(/^[a-z]+$/).default('bookworm').describe('Gateway: the Debian suite of the `base` template.'),
  ROLLBOX_E2B_BASE_MIRROR: z.string().url().default('http://deb.debian.org/debian').describe('Gateway: the Debian mirror the `base` template is built from.'),
  ROLLBOX_E2B_BASE_CACHE_DIR: z.string().optional().describe('Gateway: where the built `base` template (its layer files, by a digest of its recipe) and debootstrap\'s downloaded packages are kept, so a new cluster on the host (or a rebuilt Redis) reuses them. Default: `<data dir>/cache/e2b-base`.'),
  ROLLBOX_NET_STATIC_HOSTS: z.string().default('').describe('`name=ip|ip,name2=ip`: allowlisted hostnames resolved from this map instead of the host\'s resolver.'),
});

export type Config = ReturnType<typeof loadConfig>;

/** A layer read whose body nobody pulls this long gives its slot back (a host's range request has 30 s). */
const LAYER_READ_IDLE_MS = 60_000;

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
    http: { host: e.ROLLBOX_HOST, port: e.ROLLBOX_PORT, bodyLimitBytes: e.ROLLBOX_BODY_LIMIT_BYTES, layerUploadLimitBytes: e.ROLLBOX_LAYER_UPLOAD_LIMIT_BYTES, layerBlobGzipLevel: e.ROLLBOX_LAYER_BLOB_GZIP_LEVEL, layerReads: { total: e.ROLLBOX_LAYER_READS_MAX, perToken: e.ROLLBOX_LAYER_READS_PER_TOKEN, queueMs: e.ROLLBOX_LAYER_READS_QUEUE_MS, idleMs: LAYER_READ_IDLE_MS } },
    logLevel: e.ROLLBOX_LOG_LEVEL,
    layerBuild: e.ROLLBOX_LAYER_BUILD,
    layerMaxEntries: e.ROLLBOX_LAYER_MAX_ENTRIES,
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
      microvm: { mode: e.ROLLBOX_MICROVM, qemuBinary: e.ROLLBOX_QEMU, kernel: e.ROLLBOX_VM_KERNEL, initramfs: e.ROLLBOX_VM_INITRAMFS, accelerator: e.ROLLBOX_VM_ACCEL, ramDir: e.ROLLBOX_VM_RAM_DIR, bootTimeoutMs: e.ROLLBOX_VM_BOOT_TIMEOUT_MS, snapshotIdleTimeoutMs: e.ROLLBOX_VM_SNAPSHOT_IDLE_MS, returnMemory: e.ROLLBOX_VM_RETURN_MEMORY === 'on' ? { cacheReclaimSeconds: e.ROLLBOX_VM_CACHE_RECLAIM_SECONDS } : undefined },
      startChecks: e.ROLLBOX_START_CHECKS,
      memoryMiB: e.ROLLBOX_NODE_MEMORY_MIB ?? Math.floor(hostMemoryMiB * 0.85 * e.ROLLBOX_NODE_MEMORY_OVERCOMMIT),
      psi: { memoryFullMaxPct: e.ROLLBOX_NODE_PSI_MEMORY_MAX, cpuSomeMaxPct: e.ROLLBOX_NODE_PSI_CPU_MAX },
      cpuMillis: e.ROLLBOX_NODE_CPU_MILLIS ?? Math.round(os.availableParallelism() * 1000 * e.ROLLBOX_NODE_CPU_OVERCOMMIT),
      maxSandboxes: e.ROLLBOX_NODE_MAX_SANDBOXES,
      diskOvercommit: e.ROLLBOX_NODE_DISK_OVERCOMMIT,
      scratchSizeGiB: e.ROLLBOX_NODE_SCRATCH_GIB,
      swap: { sizeMiB: e.ROLLBOX_SWAP_FILE_MIB, filePath: path.resolve(e.ROLLBOX_SWAP_FILE ?? path.join(dataDir, 'worker', 'swapfile')) },
      scratchFs: e.ROLLBOX_NODE_SCRATCH_FS,
      idleUnmountMs: e.ROLLBOX_NODE_IDLE_UNMOUNT_MS,
      maxStarting: e.ROLLBOX_NODE_MAX_STARTING,
      poolRefillConcurrency: e.ROLLBOX_POOL_REFILL_CONCURRENCY,
      hostReserveMiB: e.ROLLBOX_NODE_HOST_RESERVE_MIB,
      heartbeatMs: e.ROLLBOX_HEARTBEAT_MS,
      lostAfterMs: e.ROLLBOX_NODE_LOST_AFTER_MS,
      staleAfterMs: Math.min(e.ROLLBOX_NODE_STALE_AFTER_MS, e.ROLLBOX_NODE_LOST_AFTER_MS),
      auditMs: e.ROLLBOX_NODE_AUDIT_MS,
      execOutputCapBytes: e.ROLLBOX_EXEC_OUTPUT_CAP_BYTES,
      commandGraceMs: e.ROLLBOX_COMMAND_GRACE_MS,
      besteffortHoldMs: e.ROLLBOX_BESTEFFORT_HOLD_MS,
      besteffortHeldCpuMillis: e.ROLLBOX_BESTEFFORT_HELD_CPU_MILLIS,
      syncLayers: parseList(e.ROLLBOX_SYNC_LAYERS ?? (e.ROLLBOX_POOL === 'cloud' ? 'cluster' : '')),
      gatewayUrl: e.ROLLBOX_GATEWAY_URL,
      gatewayToken: e.ROLLBOX_GATEWAY_TOKEN,
      layerFetch: e.ROLLBOX_LAYER_FETCH,
      lazy: {
        cacheMaxMiB: e.ROLLBOX_LAYER_CACHE_MAX_MIB,
        graceMs: e.ROLLBOX_LAZY_GRACE_MS,
        readTimeoutMs: e.ROLLBOX_LAZY_READ_TIMEOUT_MS,
        fetchTimeoutMs: e.ROLLBOX_LAZY_FETCH_TIMEOUT_MS,
        fetchConcurrency: e.ROLLBOX_LAZY_FETCH_CONCURRENCY,
        prefetch: e.ROLLBOX_LAZY_PREFETCH,
        prefetchWindowMs: e.ROLLBOX_LAZY_PREFETCH_WINDOW_MS,
        prefetchRuns: e.ROLLBOX_LAZY_PREFETCH_RUNS,
        readaheadChunks: e.ROLLBOX_LAZY_READAHEAD_CHUNKS,
      },
    },
    burst: {
      syncLayers: parseList(e.ROLLBOX_BURST_SYNC_LAYERS),
      provider: e.ROLLBOX_BURST_PROVIDER,
      commands: { provision: e.ROLLBOX_BURST_PROVISION_CMD, terminate: e.ROLLBOX_BURST_TERMINATE_CMD, list: e.ROLLBOX_BURST_LIST_CMD, timeoutMs: e.ROLLBOX_BURST_CMD_TIMEOUT_MS },
      tickMs: e.ROLLBOX_BURST_TICK_MS,
      gatewayUrl: e.ROLLBOX_BURST_GATEWAY_URL,
      traceMaxEvents: e.ROLLBOX_BURST_TRACE_MAX_EVENTS,
    },
    capacity: {
      safePerNode: e.ROLLBOX_CAPACITY_SAFE_PER_NODE,
      headroom: e.ROLLBOX_CAPACITY_HEADROOM,
      windowSeconds: e.ROLLBOX_CAPACITY_WINDOW_SECONDS,
      signalsFlushMs: e.ROLLBOX_SIGNALS_FLUSH_MS,
    },
    build: {
      slots: e.ROLLBOX_BUILD_SLOTS,
      lockMs: e.ROLLBOX_BUILD_LEASE_MS,
      networkAllow: parseList(e.ROLLBOX_BUILD_NETWORK_ALLOW).map((item) => {
        const m = /^(.*?)(?::(\d+))?$/.exec(item)!;
        const target = m[1]!;
        const rule = /^[\d.]+(\/\d+)?$/.test(target) ? { cidr: target } : { host: target };
        return NetworkAllowRule.parse({ ...rule, ...(m[2] ? { ports: [Number(m[2])] } : {}) });
      }),
      contextMaxBytes: e.ROLLBOX_BUILD_CONTEXT_MAX_BYTES,
      contextTtlMs: e.ROLLBOX_BUILD_CONTEXT_TTL_MS,
      cacheTtlMs: e.ROLLBOX_BUILD_CACHE_TTL_MS,
    },
    batch: {
      slots: e.ROLLBOX_BATCH_SLOTS,
      jobLockMs: e.ROLLBOX_BATCH_LEASE_MS,
      maxBytes: e.ROLLBOX_BATCH_MAX_BYTES,
      tenantWeights: Object.fromEntries(
        parseList(e.ROLLBOX_BATCH_TENANT_WEIGHTS)
          .map((kv) => kv.split('='))
          .filter((kv): kv is [string, string] => kv.length === 2 && Number(kv[1]) > 0)
          .map(([tenant, weight]) => [tenant, Number(weight)]),
      ),
    },
    registries: {
      authFile: e.ROLLBOX_REGISTRY_AUTH_FILE,
      insecure: new Set(parseList(e.ROLLBOX_REGISTRY_INSECURE).map((h) => h.toLowerCase())),
      mirrors: parseMirrors(e.ROLLBOX_REGISTRY_MIRRORS),
      timeoutMs: e.ROLLBOX_REGISTRY_TIMEOUT_MS,
      egress: { allowed: new Set(parseList(e.ROLLBOX_REGISTRY_ALLOW).map((h) => registryHostOf(h))), internal: new Set(parseList(e.ROLLBOX_REGISTRY_INTERNAL).map((h) => h.toLowerCase())) },
      rateFloor: { minBytesPerSecond: e.ROLLBOX_IMAGE_PULL_MIN_BYTES_PER_S, windowMs: e.ROLLBOX_IMAGE_PULL_RATE_WINDOW_MS },
    },
    imagePull: {
      layerConcurrency: e.ROLLBOX_IMAGE_PULL_LAYERS,
      waitMs: e.ROLLBOX_IMAGE_PULL_WAIT_MS,
      leaseMs: e.ROLLBOX_IMAGE_PULL_LEASE_MS,
      deadlineMs: e.ROLLBOX_IMAGE_PULL_DEADLINE_MS,
      memoryDir: e.ROLLBOX_IMAGE_PULL_MEMORY_DIR,
      memoryBytes: (e.ROLLBOX_IMAGE_PULL_MEMORY_MIB ?? Math.min(2048, Math.floor(hostMemoryMiB / 8))) * 1024 * 1024,
    },
    e2b: {
      pauseMode: e.ROLLBOX_E2B_PAUSE_MODE,
      pausedTtlSeconds: e.ROLLBOX_E2B_PAUSED_TTL_SECONDS,
      /** Unset: `localhost:<the gateway's port>`, known once it listens. */
      domain: e.ROLLBOX_E2B_DOMAIN,
      baseTemplate: { when: e.ROLLBOX_E2B_BASE_TEMPLATE, waitMs: e.ROLLBOX_E2B_BASE_TEMPLATE_WAIT_MS, suite: e.ROLLBOX_E2B_BASE_SUITE, mirror: e.ROLLBOX_E2B_BASE_MIRROR, cacheDir: path.resolve(e.ROLLBOX_E2B_BASE_CACHE_DIR ?? path.join(dataDir, 'cache', 'e2b-base')) },
    },
    defaultRequests: { memoryMiB: e.ROLLBOX_DEFAULT_REQUEST_MEMORY_MIB, cpuMillis: e.ROLLBOX_DEFAULT_REQUEST_CPU_MILLIS },
    runCodeLanguages: z.record(z.string(), RunCodeLanguage).parse({ ...DEFAULT_RUN_CODE_LANGUAGES, ...(e.ROLLBOX_RUN_CODE_LANGUAGES ? (JSON.parse(e.ROLLBOX_RUN_CODE_LANGUAGES) as object) : {}) }),
    model: {
      maxHoldMs: e.ROLLBOX_MODEL_MAX_HOLD_MS,
      keepaliveMs: e.ROLLBOX_MODEL_KEEPALIVE_MS,
      earlyHeadersMs: e.ROLLBOX_MODEL_EARLY_HEADERS_MS,
      leaseMs: e.ROLLBOX_MODEL_LEASE_MS,
      retryJoinSeconds: e.ROLLBOX_MODEL_RETRY_JOIN_SECONDS,
      recordTtlSeconds: e.ROLLBOX_MODEL_RECORD_TTL_SECONDS,
      connectTimeoutMs: e.ROLLBOX_MODEL_CONNECT_TIMEOUT_MS,
      probeMs: e.ROLLBOX_MODEL_PROBE_MS,
      maxReissues: e.ROLLBOX_MODEL_MAX_REISSUES,
    },
    portRelay: { listen: e.ROLLBOX_PORT_RELAY_LISTEN, address: e.ROLLBOX_PORT_RELAY_ADDRESS },
    network: {
      gatewayTargets: (e.ROLLBOX_SANDBOX_GATEWAY_URL ?? e.ROLLBOX_GATEWAY_URL ?? '').split(',').flatMap((url) => hostPortOf(url.trim()) ?? []),
      poolCidr: e.ROLLBOX_NET_POOL,
      leaseDir: e.ROLLBOX_NET_LEASE_DIR,
      probeCidr: e.ROLLBOX_NET_PROBE_CIDR,
      selfTestIntervalMs: e.ROLLBOX_NET_SELFTEST_INTERVAL_MS,
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

/** `docker.io=http://127.0.0.1:5000|https://m.example,ghcr.io=...`: mirror base URLs per registry host, in order. */
function parseMirrors(value: string): Map<string, string[]> {
  const mirrors = new Map<string, string[]>();
  for (const entry of parseList(value)) {
    const eq = entry.indexOf('=');
    if (eq <= 0) throw new Error(`invalid configuration: ROLLBOX_REGISTRY_MIRRORS: ${JSON.stringify(entry)} is not registry=URL`);
    const urls = entry.slice(eq + 1).split('|').map((u) => u.trim()).filter(Boolean);
    for (const u of urls) {
      const url = URL.canParse(u) ? new URL(u) : undefined;
      if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:') || (url.pathname !== '/' && url.pathname !== '')) throw new Error(`invalid configuration: ROLLBOX_REGISTRY_MIRRORS: ${JSON.stringify(u)} is not an http(s)://host[:port] URL`);
    }
    mirrors.set(registryHostOf(entry.slice(0, eq).trim()), urls);
  }
  return mirrors;
}

/** An http URL's host and port; undefined for none or another scheme (the relay passes bytes: the agent speaks plain HTTP to it). */
function hostPortOf(url: string): { host: string; port: number } | undefined {
  const u = url ? new URL(url) : undefined;
  if (u?.protocol !== 'http:') return undefined;
  return { host: u.hostname.replace(/^\[|\]$/g, ''), port: Number(u.port || 80) };
}

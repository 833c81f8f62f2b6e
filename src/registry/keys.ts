/**
 * Every Redis key rollbox writes, in one place. Keys that one script or one MULTI touches
 * together share a hash tag (`{sbx:ID}`, `{node:N}`, `{tenant:T}`, `{batch:ID}`,
 * `{pool:P}`, `{layers}`, ...), so each such step lands in one Redis Cluster slot; steps
 * that span entities are separate calls (see src/registry/store.ts for the order that
 * keeps the indexes safe). On one redis-server the tags change nothing.
 * Keys written before the tags existed are renamed once at start (src/registry/migrate).
 */
export const keys = {
  sandbox: (id: string) => `rb:{sbx:${id}}`,
  tenantLive: (tenant: string) => `rb:{tenant:${tenant}}:live`,
  tenantAll: (tenant: string) => `rb:{tenant:${tenant}}:all`,
  nodeSandboxes: (nodeId: string) => `rb:{node:${nodeId}}:sbx`,
  /** Of those, the ones being deleted (state `stopping`); kept by the transition script. */
  nodeStopping: (nodeId: string) => `rb:{node:${nodeId}}:stopping`,
  command: (sandboxId: string, commandId: string) => `rb:{sbx:${sandboxId}}:cmd:${commandId}`,
  /** Output of a streaming exec, as a Redis stream of chunks. */
  commandOutput: (sandboxId: string, commandId: string) => `rb:{sbx:${sandboxId}}:out:${commandId}`,
  /** A claimed command's op until it is in its node's inbox (see claim-command.lua). */
  /** A sandbox's commands in the order they were sent (the trajectory). */
  commandLog: (sandboxId: string) => `rb:{sbx:${sandboxId}}:cmds`,
  /** A worker host's inbox of one lane (see src/queues/inbox.ts); `<key>:taken` holds what it works on. */
  inbox: (nodeId: string, lane: string) => `rb:{node:${nodeId}}:inbox:${lane}`,
  idempotency: (tenant: string, key: string) => `rb:{tenant:${tenant}}:idem:${key}`,
  /** A fork's Idempotency-Key: its request hash, then its answer once every child has settled. */
  forkIdempotency: (tenant: string, key: string) => `rb:{tenant:${tenant}}:idem-fork:${key}`,
  /** Sandboxes not yet running, scored by the time after which they count as stuck. */
  unsettled: 'rb:unsettled',
  nodes: 'rb:nodes',
  /** The secret gateways sign port relay tickets with and worker hosts check them by (src/ports/tickets.ts). */
  portRelaySecret: 'rb:port-relay-secret',
  /** Hibernated sandboxes scored by when their TTL ends (no worker watches them). */
  hibernatedExpiry: 'rb:hibernated-expiry',
  layer: (digest: string) => `rb:{layers}:layer:${digest}`,
  layers: 'rb:{layers}:all',
  /** `<owner>/<name>` -> digest: owner a tenant, or `*` for the cluster's names (published); a bare `<name>` is older data (owner-less). */
  layerNames: 'rb:{layers}:names',
  /** Who owns a layer (a set of tenants; `*`: published cluster-wide). Content-addressed: each tenant that stored the bytes owns them. */
  layerOwners: (digest: string) => `rb:{layers}:owners:${digest}`,
  /**
   * digest -> how many live sandboxes refer to the layer (their layers and hibernation
   * layers), kept by the sandbox scripts so garbage collection reads no sandbox record.
   */
  layerRefs: 'rb:layer-refs',
  /** Set once every sandbox recorded before the counts existed has been counted. */
  layerRefsComplete: 'rb:layer-refs:complete',
  /** Unreferenced layers, scored by when garbage collection first saw them unreferenced. */
  layerGcCandidates: 'rb:layer-gc-candidates',
  /** How many first runs of a lazy layer opened a record (see PrefetchLists); `{layer:D}`: with its counts. */
  layerPrefetchRuns: (digest: string) => `rb:{layer:${digest}}:prefetch-runs`,
  /** chunk index -> how many of the layer's recorded first runs read it (a hash). */
  layerPrefetchCounts: (digest: string) => `rb:{layer:${digest}}:prefetch-counts`,
  /** Before run counts: a layer's prefetch list as one set of every chunk its first runs read (only removed now). */
  layerPrefetchLegacy: (digest: string) => [`rb:layer-prefetch:${digest}`, `rb:layer-prefetch-open:${digest}`],
  /** Layers stored but not yet recorded where they are used (snapshot, hibernation), scored by when the pin lapses. */
  layerPins: 'rb:layer-pins',
  lock: (name: string) => `rb:lock:${name}`,
  /** Imported and pulled images (`<owner>/<name>` -> Image JSON; owner `*`: published; a bare `<name>`: older data, owner-less). */
  images: 'rb:{images}:records',
  /** Image checks (`<owner>/<name>@<image digest>` -> ImageCheck JSON): a check holds for the content it ran on. */
  imageChecks: 'rb:{images}:checks',
  /** An image layer's diff_id (sha256 of its uncompressed tar) -> the EROFS layer it became. */
  imageDiffIds: 'rb:{images}:diffids',
  /** An image layer blob's digest (compressed, as in a manifest) -> its diff_id. */
  imageBlobs: 'rb:{images}:blobs',
  /** The latest pull of each image (`<owner>/<name>` -> ImagePull JSON); `{image-pulls}`: its scripts' keys share a slot. */
  imagePulls: 'rb:{image-pulls}',
  /** Names whose pull runs. */
  imagePullsActive: 'rb:{image-pulls}:active',
  /** Held (and renewed) by the gateway running a name's pull; lapsed: another gateway takes the pull over. */
  imagePullLease: (name: string) => `rb:{image-pulls}:lease:${name}`,
  /** An image build (Build JSON), with a TTL. */
  build: (id: string) => `rb:{build:${id}}`,
  /** Its log (BuildLogEvent JSON, a list), kept as long. */
  buildLog: (id: string) => `rb:{build:${id}}:log`,
  /** An uploaded build context (a hash: `tar`, `entries`), one tenant's by digest, with a TTL. */
  buildContext: (tenant: string, digest: string) => `rb:build-context:${tenant}:${digest}`,
  /** A build step's layer by its cache key, per tenant. */
  buildCache: (tenant: string, key: string) => `rb:{tenant:${tenant}}:build-cache:${key}`,
  /** Held by the build running that step (see src/builds/cache.ts). */
  buildCacheLock: (tenant: string, key: string) => `rb:{tenant:${tenant}}:build-lock:${key}`,
  /** The warm pools' names (a set; before the hash tags: a hash of their definitions). */
  pools: 'rb:pools',
  /** A warm pool's definition (PoolRecord JSON), in its slot: a host's offer is checked against its version. */
  pool: (pool: string) => `rb:{pool:${pool}}`,
  /** One worker host's ready sandboxes of one version of a pool (a list of sandbox ids). */
  poolReady: (pool: string, version: string, nodeId: string) => `rb:{pool:${pool}}:ready:${version}:${nodeId}`,
  /** The pool's ready lists (a set of their keys): found without a scan. */
  poolReadyLists: (pool: string) => `rb:{pool:${pool}}:ready-lists`,
  /** Claims and misses of a pool over the last minute (a zset scored by time). */
  poolEvents: (pool: string) => `rb:{pool:${pool}}:events`,
  /** Bytes of one files API request in transit between gateway and worker (short TTL). */
  filesTransfer: (requestId: string) => `rb:files:${requestId}`,
  replyChannel: (gatewayId: string) => `rb:reply:${gatewayId}`,
  stateChannel: 'rb:sandbox-states',
  /** Cloud burst: the cluster's pre-synced layer digests (a set). */
  burstSyncedLayers: 'rb:burst:synced-layers',
  /** The BurstPolicy (JSON) set by PUT /v1/burst/policy. */
  burstPolicy: 'rb:{burst}:policy',
  /** The controller's state (JSON): diversion, utilization, cloud hosts; written only by the holder of `burstLeader`. */
  burstState: 'rb:{burst}:state',
  /** The burst controller's leader lock (a fenced write checks it with the state: one slot). */
  burstLeader: 'rb:{burst}:leader',
  /** Create decisions counted by every gateway (a hash of counters). */
  burstCounts: 'rb:burst:counts',
  /** Diverted creates that found no cloud slot and went local (pending demand), scored by time. */
  burstFellBack: 'rb:{burst}:fell-back',
  /** Of those, the ones that failed, scored by when they fell back (unmet demand for a while). */
  burstFellBackFailed: 'rb:{burst}:fell-back-failed',
  /** A batch (hash: state, options, counts `n:*`, timestamps `ts:*`); its tasks' keys share the prefix. */
  batch: (id: string) => `rb:{batch:${id}}`,
  /** customId -> 1: the batch's tasks, claimed by HSETNX so a customId is taken once (the spec itself rides in its BullMQ job). */
  batchSpecs: (id: string) => `rb:{batch:${id}}:specs`,
  /** customIds whose job a runner holds now (a set; the counts' truth, not a lease: BullMQ's job locks are). */
  batchRunning: (id: string) => `rb:{batch:${id}}:running`,
  batchAttempts: (id: string) => `rb:{batch:${id}}:attempts`,
  /** customId -> terminal status (a task ends once). */
  batchDone: (id: string) => `rb:{batch:${id}}:done`,
  /** customId -> the sandbox of its latest attempt. */
  batchSandboxes: (id: string) => `rb:{batch:${id}}:sandboxes`,
  /** Result lines, one per ended task (a stream: its ids are the cursors). */
  batchResults: (id: string) => `rb:{batch:${id}}:results`,
  /** A tenant's batches, scored by creation time. */
  tenantBatches: (tenant: string) => `rb:{tenant:${tenant}}:batches`,
  /** Batches from submit until their BullMQ queue is removed after they end (a set). */
  activeBatches: 'rb:batches:active',
  /**
   * The console's signals (issue 28): one hash of counters per time bucket of
   * SIGNAL_BUCKET_SECONDS, expiring after SIGNAL_RETENTION_SECONDS, so memory is bounded
   * by time, not by traffic. `{signals}`: one slot, read together.
   */
  signalBucket: (bucketStartSec: number) => `rb:{signals}:${bucketStartSec}`,
  /** Create events for `rollbox burst record` (a stream). */
  burstTrace: 'rb:burst:trace',
} as const;

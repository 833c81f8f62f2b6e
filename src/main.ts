/**
 * The composition root: the only place that builds real dependencies (Redis connections,
 * the runc runtime, the layer store, the token verifier) and hands them to the modules.
 */
import { randomBytes } from 'node:crypto';
import dns from 'node:dns/promises';
import fs from 'node:fs/promises';
import path from 'node:path';
import { serve } from '@hono/node-server';
import type { Redis } from 'ioredis';
import pino, { type Logger } from 'pino';
import type { Config } from './config/index.ts';
import { startingAnswer, ExecService, ForkService, FilesService, TtlService, Janitor, LayerCollector, NodeRequests, PoolService, RunService, SandboxService, createGateway, createMetrics, newId, type LayerBuilder } from './gateway/index.ts';
import { RolloutKeyStore, createTokenIssuer, createTokenVerifier, loadOrCreateHsSecret } from './iam/index.ts';
import { BurstController, CommandProvider, LocalProvider, TraceRecorder, type CloudProvider } from './burst/index.ts';
import { ExtractWorkers, GzippedChunks, LayerMounts, LayerStore, buildBusyboxBase, buildLayerFromTar } from './layers/index.ts';
import { LazyLayers } from './layers/lazy/index.ts';
import { NodeDirectory, ReplyHub } from './queues/index.ts';
import { CreateJobQueues, connectJobRedis } from './queues/jobs/index.ts';
import { BlockingPool, connectRedis, parseRedisTarget, redactedRedisUrl, startRedisServer, waitForRedis, type RedisServerHandle, type RedisWaitState } from './redis/index.ts';
import { CLUSTER_OWNER, CommandLog, ForkRecords, ImageRegistry, LayerRegistry, OPERATOR, PoolRegistry, SandboxRegistry, keys, migrateKeyLayout } from './registry/index.ts';
import { ImportHolds, importImage, resolveImageRef } from './images/index.ts';
import { WorkerHost } from './workers/index.ts';
import { NetworkSelfTest, SandboxNetworks } from './workers/network/index.ts';
import { checkWorkerHostOrThrow } from './workers/host-checks/index.ts';
import { besteffortGuardOf, createRuncRuntime, createTieredRuntime } from './workers/runtime/index.ts';
import { microVmRuntimeOf } from './workers/microvm/index.ts';
import { batchesOf } from './gateway-batches.ts';
import { imagePullsOf } from './gateway-pulls.ts';
import { buildsOf } from './gateway-builds.ts';
import { gatewayConsoleOf } from './gateway-console.ts';
import { e2bOf } from './gateway-e2b.ts';
import { modelGatewayOf } from './gateway-model.ts';
import { layerSourceOf, layerSyncOf } from './worker-layers.ts';

export interface Stoppable {
  stop(): Promise<void>;
}

/** Logs go to stderr, so stdout stays for what a command prints (the `up` banner, a token). */
export function createLogger(config: Pick<Config, 'logLevel'>, name: string): Logger {
  return pino({ name, level: config.logLevel }, pino.destination({ dest: 2, sync: true }));
}

function layerStoreOf(config: Config): LayerStore {
  return new LayerStore(config.layerStoreDir);
}

export interface GatewayHandle extends Stoppable {
  url: string;
  port: number;
  gatewayId: string;
}

/**
 * A gateway listens at once: until its Redis answers (and `prepare` ran), /healthz says it
 * is starting, /readyz answers 503 with what it waits for, and every other route 503
 * `unavailable`, so an orchestrator's probe and a person see the same reason the logs give.
 */
export async function startGatewayRole(config: Config, redisUrl: string, logger: Logger, options: { prepare?: () => Promise<void> } = {}): Promise<GatewayHandle> {
  logger.info({ redis: redactedRedisUrl(redisUrl), layerStore: config.layerStoreDir, dataDir: config.dataDir, jwt: config.jwt.jwksUrl ?? config.jwt.publicKeyFile ?? config.jwt.secretFile }, 'gateway starting');
  let waiting: RedisWaitState | undefined = { reason: 'connecting', error: '' };
  let handle: (request: Request, env: unknown) => Response | Promise<Response> = (request) => startingAnswer(request, waiting);
  const server = await new Promise<ReturnType<typeof serve>>((resolve) => {
    const s = serve({ fetch: (request, env) => handle(request, env), hostname: config.http.host, port: config.http.port }, () => resolve(s));
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : config.http.port;
  const url = `http://${config.http.host}:${port}`;
  logger.info({ url }, 'gateway answering /healthz and /readyz while it starts');
  try {
    await waitForRedis(redisUrl, { logger, what: 'gateway', onState: (state) => (waiting = state) });
    waiting = { reason: 'preparing', error: '' };
    await options.prepare?.();
  } catch (err) {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    throw err;
  }
  const redis = connectRedis(redisUrl);
  await migrateKeyLayout(redis, (message, fields) => logger.info(fields, message));
  const subscriber = connectRedis(redisUrl);
  const gatewayId = newId('gw');
  const now = Date.now;
  const registry = new SandboxRegistry(redis, now);
  const commands = new CommandLog(redis, now);
  const layers = new LayerRegistry(redis);
  const images = new ImageRegistry(redis, layers, logger);
  const store = layerStoreOf(config);
  const tmpDir = path.join(config.dataDir, 'tmp');
  // Uploaded layers and image layers are extracted on worker threads, off the event loop.
  const extractWorkers = new ExtractWorkers();
  const extract = extractWorkers.extract;
  const directory = new NodeDirectory(redis, { refreshMs: Math.min(1000, config.node.heartbeatMs), now });
  const replies = new ReplyHub(subscriber, gatewayId);
  await Promise.all([directory.start(), replies.start()]);

  const consoleParts = gatewayConsoleOf(config, redis, registry, directory, logger, now);
  const metrics = createMetrics(directory, { signals: consoleParts.signals });
  // BullMQ's own connection (no auto-pipelining), for the create queues.
  const jobRedis = connectJobRedis(redisUrl, (err) => logger.debug({ err }, 'job connection error'));
  const createJobs = new CreateJobQueues(jobRedis);
  const nodes = new NodeRequests(replies, redis, createJobs);
  const blocking = new BlockingPool(() => connectRedis(redisUrl));
  const provider = burstProviderOf(config);
  const tokens = createTokenIssuer(config.jwt);
  const burst = new BurstController({
    redis,
    directory,
    images,
    registry,
    provider,
    config: { ...config.burst, localPool: config.node.pool, lostAfterMs: config.node.staleAfterMs, redisUrl },
    gatewayId,
    gatewayUrl: () => config.burst.gatewayUrl ?? url,
    issueHostToken: () => tokens.issue({ tenant: 'burst', scopes: ['layer:host'], ttlSeconds: 7 * 24 * 3600, subject: 'cloud-host' }),
    recorder: new TraceRecorder(redis, config.burst.traceMaxEvents),
    metricsRegistry: metrics.registry,
    logger,
    now,
    random: Math.random,
  });
  const layerDeps = { store, layers, images, holds: new ImportHolds(), tmpDir, maxLayerBytes: config.http.layerUploadLimitBytes, maxLayerEntries: config.layerMaxEntries, now, extract, build: config.layerBuild };
  const { imagePulls, stop: stopImagePulls } = imagePullsOf(config, redis, images, layerDeps, logger, now);
  // A create's (or a pool's) image.ref: the image holding it, pulled first if none does.
  const resolveImage = resolveImageRef(imagePulls, config.imagePull.waitMs);
  const pools = new PoolService({ pools: new PoolRegistry(redis, now), images, resolveImage, directory, placement: { choices: config.placement.choices, staleAfterMs: config.node.staleAfterMs }, defaultRequests: config.defaultRequests, now, random: Math.random });
  const sandboxes = new SandboxService({ config, registry, layers, images, resolveImage, directory, nodes, metrics, now, random: Math.random, burst, pools });
  const forks = new ForkService({ registry, layers, forks: new ForkRecords(redis), nodes, sandboxes, store, now });
  const execs = new ExecService({ redis, blocking, registry, commands, nodes, metrics, now });
  const files = new FilesService({ config, redis, registry, nodes });
  const ttls = new TtlService({ registry, nodes, now });
  const runs = new RunService({ sandboxes, redis, fetchMaxBytes: config.files.maxBytes, now });
  const buildLayer: LayerBuilder = (tar, { maxBytes }) => buildLayerFromTar(tar, { store, tmpDir, maxBytes, maxEntries: config.layerMaxEntries, extract, build: config.layerBuild });
  const { batches, runner: batchRunner, jobs: batchJobs, stop: stopBatches } = batchesOf(config, redisUrl, redis, blocking, { sandboxes, files, execs, layers, buildLayer, now }, logger, now, (succeeded) => metrics.seen.taskEnded(succeeded));
  const { builds, stop: stopBuilds } = buildsOf(config, redisUrl, { redis, sandboxes, files, execs, images, layers, imagePulls, buildLayer }, logger, now);
  const model = await modelGatewayOf(config, redisUrl, { redis, blocking, gatewayId, logger, now, metricsRegistry: metrics.registry });
  const e2bParts = e2bOf(config, { redis, registry, layers, images, store, nodes, tmpDir, sandboxes, ttls, forks, execs, files }, logger, now);
  const app = createGateway({
    config, redis, verifier: createTokenVerifier(config.jwt), rolloutKeys: new RolloutKeyStore(redis, now), sandboxes, forks, ttls, execs, files, pools, runs, batches, layers, directory, metrics, logger, now, burst,
    jobQueues: () => [...directory.list().map((n) => createJobs.queue(n.nodeId)), ...batchJobs.openQueues()],
    console: consoleParts.service({ pools: () => pools.listAll(), burst, metricsRegistry: metrics.registry }),
    buildLayer,
    layerStore: store,
    ...(config.http.layerBlobGzipLevel > 0 ? { gzippedChunks: new GzippedChunks(store, config.http.layerBlobGzipLevel) } : {}),
    model,
    e2b: e2bParts.e2b,
    sandboxMetrics: e2bParts.sandboxMetrics,
    builds: { api: builds, contextMaxBytes: config.build.contextMaxBytes },
    images: {
      records: imagePulls,
      importImage: (archive, query, owner) => importImage(archive, query, { ...layerDeps, owner }),
      syncedLayers: async () => new Set(await redis.smembers(keys.burstSyncedLayers)),
    },
  });
  const collector = new LayerCollector({ redis, layers, sandboxes: registry, images, store, graceMs: config.layerGc.graceMs, logger, now });
  const janitor = new Janitor({ redis, registry, commands, directory, lostAfterMs: config.node.lostAfterMs, intervalMs: 500, logger, now, layerGc: { collector, intervalMs: config.layerGc.intervalMs }, createJobs });
  janitor.start();
  batchRunner.start();
  imagePulls.start();
  consoleParts.signals.start();

  handle = (request, env) => app.fetch(request, env as never);
  logger.info({ url, gatewayId }, 'gateway listening');
  await burst.start();
  e2bParts.start();
  return {
    url,
    port,
    gatewayId,
    async stop() {
      janitor.stop();
      await Promise.all([stopBuilds(), stopImagePulls()]);
      await stopBatches();
      await consoleParts.signals.stop();
      await burst.stop();
      await provider?.close?.();
      directory.stop();
      await model.stop(); // before the server: held model calls end, their clients retry on another gateway
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await replies.stop();
      await extractWorkers.close();
      await blocking.close();
      await createJobs.close();
      await Promise.all([redis, jobRedis].map((c) => c.quit().catch(() => {})));
    },
  };
}

/** How this gateway starts cloud hosts when it leads the burst controller. */
function burstProviderOf(config: Config): CloudProvider | undefined {
  const { burst } = config;
  if (burst.provider === 'local') {
    return new LocalProvider({
      baseDir: path.join(config.dataDir, 'burst-hosts'),
      rollboxBin: path.resolve(import.meta.dirname, '../bin/rollbox.js'),
      env: { ROLLBOX_LOG_LEVEL: config.logLevel === 'silent' ? 'warn' : config.logLevel, ROLLBOX_HEARTBEAT_MS: String(config.node.heartbeatMs), ROLLBOX_NODE_LOST_AFTER_MS: String(config.node.lostAfterMs), ROLLBOX_NODE_STALE_AFTER_MS: String(config.node.staleAfterMs) },
    });
  }
  if (burst.provider === 'command') {
    const { provision, terminate, list, timeoutMs } = burst.commands;
    if (!provision || !terminate || !list) throw new Error('ROLLBOX_BURST_PROVIDER=command needs ROLLBOX_BURST_PROVISION_CMD, ROLLBOX_BURST_TERMINATE_CMD and ROLLBOX_BURST_LIST_CMD');
    return new CommandProvider({ provision, terminate, list, timeoutMs });
  }
  return undefined;
}

/** A worker keeps the node id it generated on first start, so a restart adopts its sandboxes. */
async function nodeIdOf(config: Config): Promise<string> {
  if (config.node.nodeId) return config.node.nodeId;
  const file = path.join(config.dataDir, 'node-id');
  const existing = await fs.readFile(file, 'utf8').then((s) => s.trim(), () => '');
  if (existing) return existing;
  const id = `node-${randomBytes(4).toString('hex')}`;
  await fs.mkdir(config.dataDir, { recursive: true });
  await fs.writeFile(file, `${id}\n`, { flag: 'wx' }).catch(() => {});
  return (await fs.readFile(file, 'utf8')).trim();
}

export interface WorkerHandle {
  nodeId: string;
  /** The host's lazy layers (when it fetches what its store lacks). */
  lazy?: LazyLayers;
  stop(options?: { destroySandboxes: boolean }): Promise<void>;
}

export async function startWorkerRole(config: Config, redisUrl: string, logger: Logger): Promise<WorkerHandle> {
  const nodeId = await nodeIdOf(config);
  logger.info({ nodeId, redis: redactedRedisUrl(redisUrl), dataDir: config.dataDir, layerStore: config.layerStoreDir }, 'worker host starting');
  await checkWorkerHostOrThrow(logger, { fatal: config.node.startChecks === 'fail' });
  await waitForRedis(redisUrl, { logger, what: `worker host ${nodeId}` });
  const redis = connectRedis(redisUrl);
  await migrateKeyLayout(redis, (message, fields) => logger.info(fields, message));
  const blocking: Redis[] = [];
  const store = layerStoreOf(config);
  const workerDir = path.join(config.dataDir, 'worker');
  // The host is made below; its lazy layers tell it (later) which sandboxes to fail.
  const hostRef: { current?: WorkerHost } = {};
  const source = layerSourceOf(config, redis, store, workerDir, logger, (digests) => hostRef.current?.failSandboxesOnLayers(digests) ?? Promise.resolve());
  const layerMounts = new LayerMounts({ dataDir: workerDir, storeDir: config.layerStoreDir, logger, idleUnmountDelayMs: config.node.idleUnmountMs, lazy: source.lazy });
  const network = new SandboxNetworks({
    nodeId,
    poolCidr: config.network.poolCidr,
    leaseDir: config.network.leaseDir,
    // Redis on another machine is a platform service too.
    blockedCidrs: [...config.network.blockedCidrs, ...ipv4HostOf(redisUrl)],
    resolveHost: async (name) => config.network.staticHosts.get(name) ?? (await dns.resolve4(name)),
    logger,
  });
  // One guard for both tiers: a latency command holds back besteffort containers and VMs alike.
  const besteffortGuard = besteffortGuardOf({ holdMs: config.node.besteffortHoldMs, heldCpuMillis: config.node.besteffortHeldCpuMillis, onError: (file, err) => logger.warn({ file, err: String(err) }, 'besteffort guard could not write a CPU quota') });
  const containers = createRuncRuntime({ dataDir: workerDir, runtimeBinary: config.node.runtimeBinary, layerMounts, nodeId, logger, network, scratchSizeGiB: config.node.scratchSizeGiB, scratchFs: config.node.scratchFs, scratchIdleUnmountMs: config.node.idleUnmountMs, besteffortGuard, swap: config.node.swap });
  // A microVM's snapshot is read from its guest's tar stream on a thread of its own, off the event loop.
  const extractWorkers = new ExtractWorkers(1);
  const microvm = microVmRuntimeOf(config.node.microvm, path.join(workerDir, 'microvm'), nodeId, { logger, network, besteffortGuard, extract: extractWorkers.extract, ...(source.lazy ? { lazy: source.lazy } : {}) });
  const host = new WorkerHost({
    config: { ...config.node, nodeId },
    redis,
    connectBlocking: () => {
      const connection = connectRedis(redisUrl);
      blocking.push(connection);
      return connection;
    },
    // Closed by the host itself (its create Worker may be restarted by the watchdog with a new one).
    connectJobs: () => connectJobRedis(redisUrl, (err) => logger.debug({ err }, 'job connection error')),
    registry: new SandboxRegistry(redis),
    commands: new CommandLog(redis),
    runtime: createTieredRuntime(containers, microvm.runtime),
    ...(microvm.runtime ? { tiers: { microvm: { accelerator: microvm.runtime.accelerator } } } : {}),
    layerFiles: source.layerFiles,
    ...(source.lazy ? { layerCache: source.lazy } : {}),
    storeLayerImage: (tmpImagePath) => store.put(tmpImagePath),
    storeSplitLayer: (files) => store.putSplit(files),
    hibernatedImageDirOf: (sandboxId) => store.hibernatedImageDirOf(sandboxId),
    forkImageDirOf: (forkPointId) => store.forkImageDirOf(forkPointId),
    tmpDir: path.join(workerDir, 'tmp'),
    logger,
    syncLayers: config.node.syncLayers.length ? layerSyncOf(config, redis, store, path.join(workerDir, 'tmp'), source.lazy) : undefined,
    networkSelfTest: new NetworkSelfTest({ networks: network, nodeId, probeCidr: config.network.probeCidr, intervalMs: config.network.selfTestIntervalMs }),
  });
  // The gate first: an adopted sandbox's lazy layers are its.
  await source.lazy?.start();
  const housekeeping = source.lazy && setInterval(() => void source.lazy!.collect().then(() => source.lazy!.enforceLimit()).catch((err: unknown) => logger.warn({ err }, 'lazy layer housekeeping failed')), config.layerGc.intervalMs).unref();
  hostRef.current = host;
  await host.start();
  return {
    nodeId,
    lazy: source.lazy,
    async stop(options = { destroySandboxes: false }) {
      clearInterval(housekeeping);
      await host.stop(options);
      // Nothing is mounted any more after a destroying stop: the gate can end with it.
      await source.lazy?.stop({ shutdownGate: options.destroySandboxes });
      await extractWorkers.close();
      await Promise.all([redis, ...blocking].map((c) => c.quit().catch(() => {})));
    },
  };
}

/** The IPv4 addresses of the Redis a URL names (every seed node of a cluster). */
function ipv4HostOf(url: string): string[] {
  const target = parseRedisTarget(url);
  const hosts = target.kind === 'cluster' ? target.nodes.map((n) => n.host) : [new URL(target.url).hostname];
  return [...new Set(hosts.filter((host) => /^\d+\.\d+\.\d+\.\d+$/.test(host)))];
}

/** Registers the default `busybox` base layer if this cluster has none yet. */
export async function ensureBaseLayer(config: Config, redisUrl: string): Promise<string> {
  const redis = connectRedis(redisUrl);
  try {
    const layers = new LayerRegistry(redis);
    const existing = await layers.resolve('busybox', OPERATOR).catch(() => undefined);
    const store = layerStoreOf(config);
    // Published for every tenant (one stored before owners existed too).
    if (existing && (await store.has(existing.digest))) return (await layers.publish(existing.digest, 'busybox')).digest;
    const built = await buildBusyboxBase({ store, tmpDir: path.join(config.dataDir, 'tmp'), build: config.layerBuild });
    await layers.register({ digest: built.digest, sizeBytes: built.sizeBytes, name: 'busybox', parents: [], createdAt: new Date().toISOString() }, CLUSTER_OWNER);
    return built.digest;
  } finally {
    await redis.quit().catch(() => {});
  }
}

export interface EmbeddedStack extends Stoppable {
  url: string;
  redisUrl: string;
  adminToken: string;
  nodeId: string;
}

/**
 * `rollbox up`: its own redis-server (unless REDIS_URL is set) with data under the data
 * dir, the busybox base layer, one worker host and one gateway.
 */
export async function startEmbedded(config: Config, logger: Logger): Promise<EmbeddedStack> {
  await fs.mkdir(config.dataDir, { recursive: true });
  let redisServer: RedisServerHandle | undefined;
  const stops: (() => Promise<void>)[] = [];
  const stopAll = async () => {
    for (const stop of stops.reverse()) await stop().catch((err) => logger.error({ err }, 'stop failed'));
    stops.length = 0;
  };
  try {
    if (!config.redisUrl) {
      redisServer = await startRedisServer({ dataDir: path.join(config.dataDir, 'redis') });
      stops.push(() => redisServer!.stop());
    }
    const redisUrl = config.redisUrl ?? redisServer!.url;
    if (config.jwt.alg === 'HS256') await loadOrCreateHsSecret(config.jwt.secretFile);
    await ensureBaseLayer(config, redisUrl);
    const worker = await startWorkerRole(config, redisUrl, logger.child({ role: 'worker' }));
    stops.push(() => worker.stop({ destroySandboxes: true }));
    const gateway = await startGatewayRole(config, redisUrl, logger.child({ role: 'gateway' }));
    stops.push(() => gateway.stop());
    const adminToken = await createTokenIssuer(config.jwt).issue({ tenant: 'admin', scopes: ['admin'], ttlSeconds: 30 * 24 * 3600 });
    return { url: gateway.url, redisUrl, adminToken, nodeId: worker.nodeId, stop: stopAll };
  } catch (err) {
    await stopAll();
    throw err;
  }
}

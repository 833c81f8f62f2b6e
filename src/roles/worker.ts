/** The worker host role, built from config: the runtime, networks, layers and the host loop; and the cluster's base layer. */
import { randomBytes } from 'node:crypto';
import dns from 'node:dns/promises';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Redis } from 'ioredis';
import { type Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { ExtractWorkers, LayerMounts, buildBusyboxBase } from '../layers/index.ts';
import { LazyLayers } from '../layers/lazy/index.ts';
import { connectJobRedis } from '../queues/jobs/index.ts';
import { connectRedis, parseRedisTarget, redactedRedisUrl, waitForRedis } from '../redis/index.ts';
import { CLUSTER_OWNER, CommandLog, LayerRegistry, OPERATOR, SandboxRegistry, migrateKeyLayout } from '../registry/index.ts';
import { WorkerHost } from '../workers/index.ts';
import { NetworkSelfTest, SandboxNetworks } from '../workers/network/index.ts';
import { checkWorkerHostOrThrow } from '../workers/host-checks/index.ts';
import { besteffortGuardOf, createRuncRuntime, createTieredRuntime } from '../workers/runtime/index.ts';
import { microVmRuntimeOf } from '../workers/microvm/index.ts';
import { layerSourceOf, layerSyncOf } from './worker-layers.ts';
import { layerStoreOf } from './shared.ts';
import { PortForwarder, PortRelay, PortTickets } from '../ports/index.ts';
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

export async function startWorkerRole(config: Config, redisUrl: string, logger: Logger, options: { gatewayTargets?: () => { host: string; port: number }[] } = {}): Promise<WorkerHandle> {
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
    gatewayTargets: () => (config.network.gatewayTargets.length ? config.network.gatewayTargets : (options.gatewayTargets?.() ?? [])),
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
    gatewayReach: () => network.gatewayReach(),
    networkSelfTest: new NetworkSelfTest({ networks: network, nodeId, probeCidr: config.network.probeCidr, intervalMs: config.network.selfTestIntervalMs }),
  });
  // The gate first: an adopted sandbox's lazy layers are its.
  await source.lazy?.start();
  const housekeeping = source.lazy && setInterval(() => void source.lazy!.collect().then(() => source.lazy!.enforceLimit()).catch((err: unknown) => logger.warn({ err }, 'lazy layer housekeeping failed')), config.layerGc.intervalMs).unref();
  hostRef.current = host;
  // Traffic into its sandboxes' ports, told to gateways by the first heartbeat.
  const portsDir = path.join(workerDir, 'ports');
  const forwarder = new PortForwarder({ dir: portsDir, logger });
  const relay = new PortRelay({ tickets: new PortTickets(redis), forwarder, netnsOf: (id) => host.portNetnsOf(id), controlPath: path.join(portsDir, 'relay-control.sock'), logger });
  host.portRelay = await listenPortRelay(relay, config.portRelay);
  await host.start();
  return {
    nodeId,
    lazy: source.lazy,
    async stop(options = { destroySandboxes: false }) {
      clearInterval(housekeeping);
      await relay.stop();
      await host.stop(options);
      // Nothing is mounted any more after a destroying stop: the gate can end with it.
      await source.lazy?.stop({ shutdownGate: options.destroySandboxes });
      await extractWorkers.close();
      await Promise.all([redis, ...blocking].map((c) => c.quit().catch(() => {})));
    },
  };
}

/** Listens; answers the address gateways dial (the configured one, else where it listens). */
async function listenPortRelay(relay: PortRelay, config: Config['portRelay']): Promise<string> {
  const at = config.listen.lastIndexOf(':');
  const listening = await relay.listen(config.listen.slice(0, at).replace(/^\[(.*)\]$/, '$1'), Number(config.listen.slice(at + 1)));
  return config.address ?? listening;
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

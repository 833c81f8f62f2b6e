/** The gateway role, built from config: the HTTP API, its services, queues and background loops. */
import path from 'node:path';
import { createAdaptorServer } from '@hono/node-server';
import { type Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { startingAnswer, serveUpgrades, PortsService, ExecService, ForkService, FilesService, TtlService, Janitor, LayerCollector, NodeRequests, PoolService, RunService, SandboxService, createGateway, createMetrics, newId, type LayerBuilder } from '../gateway/index.ts';
import { RolloutKeyStore, createTokenIssuer, createTokenVerifier } from '../iam/index.ts';
import { ModelCallLog, RolloutLimits } from '../model-gateway/index.ts';
import { JobRolloutTimesStore, RolloutService, rolloutEndOf } from '../rollouts/index.ts';
import { BurstController, CommandProvider, LocalProvider, TraceRecorder, type CloudProvider } from '../burst/index.ts';
import { ExtractWorkers, GzippedChunks, buildLayerFromTar } from '../layers/index.ts';
import { NodeDirectory, ReplyHub } from '../queues/index.ts';
import { CreateJobQueues, connectJobRedis } from '../queues/jobs/index.ts';
import { BlockingPool, connectRedis, redactedRedisUrl, waitForRedis, type RedisWaitState } from '../redis/index.ts';
import { BatchStore, CommandLog, ForkRecords, ImageRegistry, LayerRegistry, PoolRegistry, RolloutRecords, SandboxRegistry, keys, migrateKeyLayout } from '../registry/index.ts';
import { ImportHolds, importImage, resolveImageRef } from '../images/index.ts';
import { batchesOf } from './gateway-batches.ts';
import { ImageChecks } from '../image-checks/index.ts';
import { imagePullsOf } from './gateway-pulls.ts';
import { buildsOf } from './gateway-builds.ts';
import { gatewayConsoleOf } from './gateway-console.ts';
import { e2bOf } from './gateway-e2b.ts';
import { modelGatewayOf } from './gateway-model.ts';
import { layerStoreOf, type Stoppable } from './shared.ts';
import { PortProxy, PortTickets } from '../ports/index.ts';
import type { Server } from 'node:http';
export interface GatewayHandle extends Stoppable {
  url: string;
  port: number;
  gatewayId: string;
}

const LISTEN_BACKLOG = 65_535;

/**
 * A gateway listens at once: until its Redis answers (and `prepare` ran), /healthz says it
 * is starting, /readyz answers 503 with what it waits for, and every other route 503
 * `unavailable`, so an orchestrator's probe and a person see the same reason the logs give.
 */
export async function startGatewayRole(config: Config, redisUrl: string, logger: Logger, options: { prepare?: () => Promise<void> } = {}): Promise<GatewayHandle> {
  logger.info({ redis: redactedRedisUrl(redisUrl), layerStore: config.layerStoreDir, dataDir: config.dataDir, jwt: config.jwt.jwksUrl ?? config.jwt.publicKeyFile ?? config.jwt.secretFile }, 'gateway starting');
  let waiting: RedisWaitState | undefined = { reason: 'connecting', error: '' };
  let handle: (request: Request, env: unknown) => Response | Promise<Response> = (request) => startingAnswer(request, waiting);
  const server = createAdaptorServer({ fetch: (request, env) => handle(request, env), hostname: config.http.host });
  // A job asking for thousands of sandboxes at once opens as many connections: Node's default
  // backlog (511) overflowed and reset some of them (the kernel caps it at net.core.somaxconn).
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port: config.http.port, host: config.http.host, backlog: LISTEN_BACKLOG }, () => {
      server.off('error', reject);
      resolve();
    });
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
  const rolloutKeys = new RolloutKeyStore(redis, now);
  const rolloutRecords = new RolloutRecords(redis, config.model.recordTtlSeconds);
  const rolloutLimits = new RolloutLimits(redis, config.model.recordTtlSeconds);
  const jobTimes = new JobRolloutTimesStore(redis, now);
  const rolloutService = new RolloutService({ records: rolloutRecords, calls: new ModelCallLog(redis), limits: rolloutLimits, commands, batches: new BatchStore(redis, now), jobTimes });
  const rollouts = { keys: rolloutKeys, records: rolloutRecords, limits: rolloutLimits, times: rolloutService };
  const { batches, runner: batchRunner, jobs: batchJobs, stop: stopBatches } = batchesOf(config, redisUrl, redis, blocking, { sandboxes, files, execs, layers, buildLayer, now, rollouts }, logger, now, async ({ tenant, task, line }) => {
    metrics.seen.taskEnded(line.status === 'succeeded');
    if (!task.agent || !task.model) return;
    const end = rolloutEndOf(line);
    metrics.seen.rolloutEnded(tenant, task.model.job, end, line.rollout?.timesMs);
    await jobTimes.add(tenant, task.model.job, end, line.rollout?.timesMs);
  }, (principal, tasks) => imageChecks.requireValidated(principal, tasks));
  // After the batches: a check's runs are a batch (the batches ask it back whether images passed).
  const imageChecks: ImageChecks = new ImageChecks({ redis, images, batches, now });
  const { builds, stop: stopBuilds } = buildsOf(config, redisUrl, { redis, sandboxes, files, execs, images, layers, imagePulls, buildLayer }, logger, now);
  const model = await modelGatewayOf(config, redisUrl, { redis, blocking, gatewayId, logger, now, metricsRegistry: metrics.registry });
  const ports = new PortsService({ registry, now, proxy: new PortProxy({ tickets: new PortTickets(redis), relayOf: (nodeId) => directory.portRelayOf(nodeId) }) });
  const e2bParts = e2bOf(config, { redis, registry, layers, images, store, nodes, tmpDir, sandboxes, ttls, forks, execs, files, builds }, logger, now, port);
  const app = createGateway({
    config, redis, verifier: createTokenVerifier(config.jwt), rolloutKeys, sandboxes, forks, ttls, execs, files, pools, runs, batches, layers, directory, metrics, logger, now, burst,
    jobQueues: () => [...directory.list().map((n) => createJobs.queue(n.nodeId)), ...batchJobs.openQueues()],
    console: consoleParts.service({ pools: () => pools.listAll(), rolloutJobs: jobTimes, burst, metricsRegistry: metrics.registry }),
    buildLayer,
    layerStore: store,
    ...(config.http.layerBlobGzipLevel > 0 ? { gzippedChunks: new GzippedChunks(store, config.http.layerBlobGzipLevel) } : {}),
    model,
    rollouts: rolloutService,
    e2b: e2bParts.e2b,
    ports,
    sandboxMetrics: e2bParts.sandboxMetrics,
    builds: { api: builds, contextMaxBytes: config.build.contextMaxBytes },
    images: {
      records: imagePulls,
      checks: imageChecks,
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
  serveUpgrades(server as Server, (request, env) => handle(request, env));
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
      rollboxBin: path.resolve(import.meta.dirname, '../../bin/rollbox.js'),
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

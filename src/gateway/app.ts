import { OpenAPIHono } from '@hono/zod-openapi';
import { bodyLimit } from 'hono/body-limit';
import { timing } from 'hono/timing';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { RollboxError } from '../api/index.ts';
import type { Config } from '../config/index.ts';
import type { RolloutKeyStore, TokenVerifier } from '../iam/index.ts';
import type { ModelGateway } from '../model-gateway/index.ts';
import type { RolloutService } from '../rollouts/index.ts';
import type { NodeDirectory } from '../queues/index.ts';
import { authenticate, authenticateFromUrl, confineRolloutKeys, type GatewayEnv } from './auth.ts';
import { EnvdAccess, e2bPortHosts, registerE2b, type E2bDeps } from './e2b/index.ts';
import type { PortsService } from './ports-service.ts';
import { registerPortRoutes } from './routes/ports.ts';
import { registerMetricsRoutes } from './routes/metrics.ts';
import type { SandboxMetricsService } from './sandbox-metrics.ts';
import { describeZodError, errorResponse, handleError } from './errors.ts';
import type { GatewayMetrics } from './metrics.ts';
import { NDJSON, registerBatchRoutes, type BatchApi } from './routes/batches.ts';
import { registerRolloutRoutes } from './routes/rollouts.ts';
import { registerClusterRoutes, type BurstApi } from './routes/cluster.ts';
import { registerCommandRoutes, type ExecApi } from './routes/commands.ts';
import { registerConsoleRoutes, type ConsoleApi } from './routes/console.ts';
import { registerFilesRoutes, type FilesApi } from './routes/files.ts';
import { registerForkRoutes, type ForkApi } from './routes/forks.ts';
import { registerImageRoutes, type ImageRouteDeps } from './routes/images.ts';
import { registerBuildRoutes, type BuildApi } from './routes/builds.ts';
import { registerLayerRoutes, type LayerBuilder, type LayerRouteDeps } from './routes/layers.ts';
import { modelErrorFlavor, modelErrorResponse, registerModelRoutes, type ModelApiDeps } from './routes/model.ts';
import { LayerReads } from './layer-reads.ts';
import { registerPoolRoutes, type PoolApi } from './routes/pools.ts';
import { registerRunRoutes, type RunApi } from './routes/run.ts';
import { registerSandboxRoutes, type SandboxApi, type TtlApi } from './routes/sandboxes.ts';
import { registerQueueBoard, type QueueBoardDeps } from './queue-board/index.ts';
import { registerBatchPage, registerConsolePage } from './ui/index.ts';

export type { LayerBuilder } from './routes/layers.ts';

/** What the gateway's routes call: interfaces, so a route can be tested in process (app.request). */
export interface GatewayDeps {
  config: Pick<Config, 'http' | 'files' | 'runCodeLanguages'>;
  redis: Pick<Redis, 'ping'>;
  verifier: TokenVerifier;
  /** Hosted rollouts' keys (src/iam/rollout-keys.ts): accepted on /v1 and confined to their rollout. */
  rolloutKeys?: Pick<RolloutKeyStore, 'verify' | 'allowsSandbox'>;
  sandboxes: SandboxApi;
  forks: ForkApi;
  ttls: TtlApi;
  execs: ExecApi;
  files: FilesApi;
  pools: PoolApi;
  runs: RunApi;
  batches: BatchApi;
  layers: LayerRouteDeps['layers'];
  buildLayer: LayerBuilder;
  /** The layer store the layer routes serve files from. */
  layerStore: LayerRouteDeps['store'];
  /** Blob ranges gzipped for the hosts that read layers on demand (none: ROLLBOX_LAYER_BLOB_GZIP_LEVEL 0). */
  gzippedChunks?: LayerRouteDeps['gzippedChunks'];
  images: ImageRouteDeps;
  /** Image builds (src/builds); absent: not served. */
  builds?: { api: BuildApi; contextMaxBytes: number };
  directory: Pick<NodeDirectory, 'list'>;
  metrics: Pick<GatewayMetrics, 'registry' | 'middleware'>;
  logger: Logger;
  now: () => number;
  /** Cloud burst status and policy (src/burst). */
  burst?: BurstApi;
  /** The BullMQ queues operators see at /ui/queues (bull-board); absent: not served. */
  jobQueues?: QueueBoardDeps['queues'];
  /** The operator console's figures (src/gateway/console); absent: /v1/cluster/capacity and the console page are not served. */
  console?: ConsoleApi;
  /** The E2B SDK's control plane and envd (src/gateway/e2b); absent: not served. */
  e2b?: E2bDeps;
  /** The model gateway (src/model-gateway): model calls of hosted rollouts, job upstreams, model holds; absent: not served. */
  model?: ModelApiDeps & Pick<ModelGateway, 'setJobPaused'>;
  /** Traffic into sandboxes' ports (`/v1/sandboxes/:id/ports/:port/...`, E2B's `getHost` names); absent: not served. */
  ports?: Pick<PortsService, 'ofTenant' | 'byId' | 'pass'>;
  /** Hosted rollouts' records and trajectories (src/rollouts); absent: /v1/rollouts is not served. */
  rollouts?: Pick<RolloutService, 'get' | 'trajectory' | 'jobTimes'>;
  /** `GET /v1/sandboxes/:id/metrics`; absent: not served. */
  sandboxMetrics?: Pick<SandboxMetricsService, 'sample'>;
}

/**
 * The gateway's HTTP app: operations endpoints, then everything under /v1 behind a token,
 * with bodies capped before any handler reads them. Routes live by resource in routes/;
 * they throw typed errors, and errors.ts alone turns them into answers.
 */
export function createGateway(deps: GatewayDeps): OpenAPIHono<GatewayEnv> {
  const app = new OpenAPIHono<GatewayEnv>({
    defaultHook: (result, c) => {
      if (!result.success) return errorResponse(c, 'invalid_request', describeZodError(result.error, result.target === 'json' ? 'body' : result.target));
    },
  });
  const onError = handleError(deps.logger);
  // Model routes answer in the shape their SDK parses (OpenAI's, or Anthropic's on /messages), auth errors included.
  app.onError((err, c) => {
    const flavor = deps.model && err instanceof RollboxError ? modelErrorFlavor(c.req.path) : undefined;
    return flavor ? modelErrorResponse(flavor, err) : onError(err, c);
  });
  app.notFound((c) => errorResponse(c, 'not_found', `no route ${c.req.method} ${c.req.path}`));
  app.openAPIRegistry.registerComponent('securitySchemes', 'bearer', { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' });

  app.use('*', deps.metrics.middleware);
  // A request named by an E2B sandbox's getHost(port) goes there whatever its path: before every route.
  if (deps.e2b && deps.ports) app.use('*', e2bPortHosts({ ports: deps.ports, access: new EnvdAccess(deps.e2b.redis) }));

  // Operations (no auth: scraped and probed from inside the cluster).
  app.get('/healthz', (c) => c.json({ ok: true }));
  app.get('/metrics', async (c) => c.text(await deps.metrics.registry.metrics(), 200, { 'content-type': deps.metrics.registry.contentType }));
  app.get('/readyz', async (c) => {
    const redisOk = await deps.redis.ping().then(() => true, () => false);
    const nodes = deps.directory.list().filter((n) => n.healthy).length;
    return c.json({ ready: redisOk, redis: redisOk, healthyNodes: nodes }, redisOk ? 200 : 503);
  });
  app.doc31('/openapi.json', { openapi: '3.1.0', info: { title: 'rollbox', version: '1' } });

  // Each answer says where its milliseconds went (Server-Timing: auth, and for exec
  // claim, dispatch, worker, run, total), readable with curl -v or a browser's devtools.
  app.use('/v1/*', timing({ totalDescription: 'gateway' }));
  app.use('/v1/*', authenticate(deps.verifier, deps.rolloutKeys));
  if (deps.rolloutKeys) app.use('/v1/*', confineRolloutKeys(deps.rolloutKeys));
  const limit = (maxSize: number, what: string) => bodyLimit({ maxSize, onError: () => { throw new RollboxError('payload_too_large', `body is larger than ${what} of ${maxSize} bytes`); } });
  const jsonLimit = limit(deps.config.http.bodyLimitBytes, 'the JSON limit');
  // File uploads have their own (larger) cap, layer uploads theirs (routes/layers.ts).
  const filesLimit = limit(deps.config.files.maxBytes, 'the files limit');
  // Traffic into a sandbox's port streams its body to the server there, under no cap of rollbox's.
  app.use('/v1/sandboxes/*', (c, next) => (/^\/v1\/sandboxes\/[^/]+\/ports\//.test(c.req.path) ? next() : /^\/v1\/sandboxes\/[^/]+\/files$/.test(c.req.path) ? filesLimit(c, next) : jsonLimit(c, next)));
  app.use('/v1/sandboxes', jsonLimit);
  app.use('/v1/jobs/*', jsonLimit);
  app.use('/v1/snapshots/*', jsonLimit);
  app.use('/v1/pools/*', jsonLimit);
  app.use('/v1/run', jsonLimit);
  app.use('/v1/images/pull', jsonLimit);
  // An NDJSON batch is read as it streams, under its own cap (routes/batches.ts).
  // (`/v1/batches/*` matches `/v1/batches` too, and bodyLimit reads a chunked body whole first.)
  app.use('/v1/batches/*', (c, next) => (c.req.path === '/v1/batches' && (c.req.header('content-type') ?? '').startsWith(NDJSON) ? next() : jsonLimit(c, next)));
  // SandboxFusion's path, outside /v1: its clients post to a configured URL ending in /run_code.
  app.use('/run_code', authenticateFromUrl(deps.verifier), jsonLimit);

  registerSandboxRoutes(app, deps.sandboxes, deps.ttls, deps.model);
  registerForkRoutes(app, deps.forks);
  registerCommandRoutes(app, deps.execs);
  registerFilesRoutes(app, deps.files);
  registerPoolRoutes(app, deps.pools);
  registerRunRoutes(app, deps.runs, deps.config.runCodeLanguages);
  registerBatchRoutes(app, deps.batches, deps.rollouts);
  registerBatchPage(app);
  if (deps.jobQueues) registerQueueBoard(app, { verifier: deps.verifier, queues: deps.jobQueues });
  registerLayerRoutes(app, { layers: deps.layers, buildLayer: deps.buildLayer, store: deps.layerStore, uploadLimitBytes: deps.config.http.layerUploadLimitBytes, reads: new LayerReads(deps.config.http.layerReads), ...(deps.gzippedChunks ? { gzippedChunks: deps.gzippedChunks } : {}), now: deps.now });
  if (deps.builds) registerBuildRoutes(app, deps.builds.api, { contextMaxBytes: deps.builds.contextMaxBytes, jsonLimit });
  registerImageRoutes(app, deps.images);
  registerClusterRoutes(app, { directory: deps.directory, burst: deps.burst, jsonLimit });
  if (deps.console) {
    registerConsoleRoutes(app, { console: deps.console, jsonLimit });
    registerConsolePage(app);
  }
  if (deps.sandboxMetrics) registerMetricsRoutes(app, deps.sandboxMetrics);
  if (deps.ports) registerPortRoutes(app, deps.ports);
  if (deps.e2b) registerE2b(app, deps.e2b);
  if (deps.model) registerModelRoutes(app, { model: deps.model, jsonLimit });
  if (deps.rollouts) registerRolloutRoutes(app, { batches: deps.batches, rollouts: deps.rollouts, jsonLimit });
  return app;
}

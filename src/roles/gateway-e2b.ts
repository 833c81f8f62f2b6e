import type { Redis } from 'ioredis';
import { mergeContexts } from '../builds/index.ts';
import type { Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { SandboxMetricsService, type GatewayDeps } from '../gateway/index.ts';
import { E2bKeyStore } from '../iam/index.ts';
import { BaseTemplate } from '../images/index.ts';
import type { LayerStore } from '../layers/index.ts';
import type { ImageRegistry, LayerRegistry, SandboxRegistry } from '../registry/index.ts';

type E2bDeps = NonNullable<GatewayDeps['e2b']>;

/**
 * Part of the composition root (roles/index.ts), built from config: the E2B surface's parts (its
 * keys, the sandboxes' metrics, the `base` template when it is on) and `start`, which
 * begins the template's build as the gateway starts when so configured.
 */
/** Entries of the files of one E2B template build, over all its COPY steps. */
const MAX_CONTEXT_ENTRIES = 200_000;

export function e2bOf(
  config: Config,
  parts: Pick<E2bDeps, 'sandboxes' | 'ttls' | 'forks' | 'execs' | 'files'> & { redis: Redis; registry: SandboxRegistry; layers: LayerRegistry; images: ImageRegistry; store: LayerStore; nodes: ConstructorParameters<typeof SandboxMetricsService>[0]['nodes']; tmpDir: string; builds?: NonNullable<E2bDeps['builds']>['builds'] },
  logger: Logger,
  now: () => number,
  /** The port the gateway listens on: the default domain is `localhost:<port>`. */
  httpPort: number,
): { e2b: E2bDeps; sandboxMetrics: SandboxMetricsService; start: () => void } {
  const { redis, registry, layers, images, store, nodes, tmpDir, builds, ...services } = parts;
  const { when, ...templateConfig } = config.e2b.baseTemplate;
  const baseTemplate = when === 'off' ? undefined : new BaseTemplate({ redis, images, layers, store, tmpDir, config: templateConfig, logger: logger.child({ template: 'base' }), now });
  const sandboxMetrics = new SandboxMetricsService({ registry, nodes });
  const e2b: E2bDeps = {
    ...services,
    redis,
    registry,
    layers,
    keys: new E2bKeyStore(redis, now),
    metrics: sandboxMetrics,
    filesMaxBytes: config.files.maxBytes,
    baseTemplate,
    options: { pauseMode: config.e2b.pauseMode, pausedTtlSeconds: config.e2b.pausedTtlSeconds, baseTemplateWaitMs: config.e2b.baseTemplate.waitMs, domain: config.e2b.domain ?? `localhost:${httpPort}` },
    ...(builds ? { builds: { builds, mergeUploads: (uploads) => mergeContexts(uploads, { maxEntries: MAX_CONTEXT_ENTRIES }), contextMaxBytes: config.build.contextMaxBytes, uploadTtlMs: config.build.contextTtlMs } } : {}),
  };
  // Progress and failures are logged; a create of `base` tries again after a failure.
  return { e2b, sandboxMetrics, start: () => void (when === 'start' && baseTemplate?.start().catch(() => undefined)) };
}

import { Readable } from 'node:stream';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import tar from 'tar-stream';
import type { LayerDigest } from './api/index.ts';
import { BuildService, StepCache } from './builds/index.ts';
import type { Config } from './config/index.ts';
import type { ExecService, FilesService, LayerBuilder, SandboxService } from './gateway/index.ts';
import type { ImagePulls } from './images/index.ts';
import { connectJobRedis } from './queues/jobs/index.ts';
import { CLUSTER_OWNER, type ImageRegistry, type LayerRegistry } from './registry/index.ts';

/** The image a FROM's registry reference is pulled into is waited for this long. */
const FROM_PULL_WAIT_MS = 30 * 60_000;

/**
 * Part of the composition root (main.ts), built from config: a gateway's image builds,
 * their BullMQ queue and worker (started here) on BullMQ's own connection, and the step cache.
 */
export function buildsOf(
  config: Config,
  redisUrl: string,
  parts: { redis: Redis; sandboxes: SandboxService; files: FilesService; execs: ExecService; images: ImageRegistry; layers: LayerRegistry; imagePulls: Pick<ImagePulls, 'imageFor'>; buildLayer: LayerBuilder },
  logger: Logger,
  now: () => number,
): { builds: BuildService; stop: () => Promise<void> } {
  const jobConnection = connectJobRedis(redisUrl, (err) => logger.debug({ err: String(err) }, 'build job connection error'));
  let empty: Promise<LayerDigest> | undefined;
  // The floor of a `FROM scratch` stage: a layer with nothing in it, made once per gateway (the same digest everywhere).
  const emptyLayer = () =>
    (empty ??= (async () => {
      const pack = tar.pack();
      pack.finalize();
      const built = await parts.buildLayer(Readable.from(pack), { maxBytes: 1024 * 1024 });
      await parts.layers.register({ digest: built.digest, sizeBytes: built.sizeBytes, parents: [], createdAt: new Date(now()).toISOString() }, CLUSTER_OWNER);
      return built.digest as LayerDigest;
    })().catch((err: unknown) => {
      empty = undefined;
      throw err;
    }));
  const builds = new BuildService({
    redis: parts.redis,
    jobConnection,
    images: parts.images,
    layers: parts.layers,
    engine: {
      sandboxes: parts.sandboxes,
      files: parts.files,
      execs: parts.execs,
      images: parts.images,
      layers: parts.layers,
      pull: (ref, tenant) => parts.imagePulls.imageFor(ref, 'linux/amd64', FROM_PULL_WAIT_MS, tenant),
      emptyLayer,
      cache: new StepCache({ redis: parts.redis, layers: parts.layers, ttlMs: config.build.cacheTtlMs, now }),
      networkAllow: config.build.networkAllow,
      stepLeaseMs: config.build.lockMs,
    },
    slots: config.build.slots,
    lockMs: config.build.lockMs,
    contextMaxBytes: config.build.contextMaxBytes,
    contextTtlMs: config.build.contextTtlMs,
    recordTtlMs: 7 * 24 * 3600_000,
    logger: logger.child({ name: 'builds' }),
    now,
  });
  builds.start();
  return {
    builds,
    stop: async () => {
      await builds.stop();
      await jobConnection.quit().catch(() => undefined);
    },
  };
}

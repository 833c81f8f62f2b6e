import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { Config } from './config/index.ts';
import { ImagePulls, pullImage, type ImageImportDeps, type ImagePullsDeps } from './images/index.ts';
import { MemoryScratch } from './layers/index.ts';
import { RegistryRepository, loadDockerConfig } from './oci-registry/index.ts';
import { ImagePullRecords } from './registry/index.ts';

/**
 * Part of the composition root (main.ts), built from config: a gateway's image pulls, their
 * registry clients (the operator's credentials read at each pull) and, when layers are built
 * by extraction, the tmpfs room their trees are extracted in. `stop` ends the pulls and lets
 * go of that room.
 */
export function imagePullsOf(config: Config, redis: Redis, images: ImagePullsDeps['images'], layerDeps: ImageImportDeps & { layers: ImagePullsDeps['layers'] }, logger: Logger, now: () => number): { imagePulls: ImagePulls; stop: () => Promise<void> } {
  const memory = config.layerBuild === 'extract' ? MemoryScratch.at(config.imagePull.memoryDir, config.imagePull.memoryBytes) : undefined;
  const imagePulls = new ImagePulls({
    images,
    pulls: new ImagePullRecords(redis, logger),
    layers: layerDeps.layers,
    leaseMs: config.imagePull.leaseMs,
    deadlineMs: config.imagePull.deadlineMs,
    egress: config.registries.egress,
    logger: logger.child({ name: 'image-pulls' }),
    now,
    pull: (target, listener, signal) =>
      pullImage(target, { ...layerDeps, memory, layerConcurrency: config.imagePull.layerConcurrency, repository: async (ref, signal) => new RegistryRepository(ref, { ...config.registries, credentials: await loadDockerConfig(config.registries.authFile), signal }) }, listener, signal),
  });
  return {
    imagePulls,
    stop: async () => {
      await imagePulls.stop();
      memory?.remove();
    },
  };
}

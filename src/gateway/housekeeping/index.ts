/**
 * Cluster housekeeping every gateway runs (one at a time per item, through Redis locks):
 * the janitor ends what lost its host, never settled or outlived its TTL; the layer
 * collector removes layers nothing has referenced for a grace period, and images left behind.
 */
export { Janitor } from './janitor.ts';
export { FORK_IMAGE_MAX_AGE_MS, LayerCollector } from './layer-gc.ts';
export type { LayerCollectorDeps } from './layer-gc.ts';

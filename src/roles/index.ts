/**
 * The composition root: the only place that builds real dependencies (Redis connections,
 * the runc runtime, the layer store, the token verifier) and hands them to the modules.
 */
export { createLogger, type Stoppable } from './shared.ts';
export { startGatewayRole, type GatewayHandle } from './gateway.ts';
export { ensureBaseLayer, startWorkerRole, type WorkerHandle } from './worker.ts';
export { startEmbedded, type EmbeddedStack } from './up.ts';

export { createGateway } from './app.ts';
export type { GatewayDeps, LayerBuilder } from './app.ts';
export { SandboxService, newId } from './sandbox-service.ts';
export type { SandboxServiceDeps, QueueProvider } from './sandbox-service.ts';
export { Janitor } from './janitor.ts';
export { createMetrics } from './metrics.ts';
export type { GatewayMetrics } from './metrics.ts';

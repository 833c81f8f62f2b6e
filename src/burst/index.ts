/**
 * Cloud burst (issue 5, "Cloud burst with pre-synced layers"): the pure policy shared by
 * the live controller and the simulator, the trace generator and the simulator.
 */
export { utilizationOf, stepDiversion, decideCreate, planCloudScaling, INITIAL_DIVERSION_STATE, mulberry32, rngStream } from './policy/index.ts';
export type { NodeUsage, DiversionState, CreateDecision, CloudHostView, CloudScalingInput, CloudScalingPlan } from './policy/index.ts';
export { BurstController, CLOUD_POOL } from './controller/index.ts';
export type { BurstControllerDeps } from './controller/index.ts';
export { CommandProvider, LocalProvider } from './providers/index.ts';
export type { CloudProvider, ProviderHost, ProvisionRequest } from './providers/index.ts';
export { TraceRecorder, exportTrace } from './trace/index.ts';
export type { ExportedTrace } from './trace/index.ts';

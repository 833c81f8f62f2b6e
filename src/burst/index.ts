/**
 * Cloud burst (issue 5, "Cloud burst with pre-synced layers"): the pure policy shared by
 * the live controller and the simulator, the trace generator and the simulator.
 */
export { utilizationOf, stepDiversion, decideCreate, planCloudScaling, INITIAL_DIVERSION_STATE, mulberry32, rngStream } from './policy/index.ts';
export type { NodeUsage, DiversionState, CreateDecision, CloudHostView, CloudScalingInput, CloudScalingPlan } from './policy/index.ts';

export { ModelGateway } from './service.ts';
export type { ModelGatewayDeps } from './service.ts';
export { ModelCallLog, RolloutLimits, JobFigures } from './log.ts';
export { ModelBindings, bindingView } from './bindings.ts';
export { JobHolds } from './holds.ts';
export { errorBody } from './dialects/index.ts';
export { modelKeys } from './keys.ts';

export { ConsoleService } from './service.ts';
export type { ConsoleServiceDeps } from './service.ts';
export { SignalRecorder } from './recorder.ts';
export type { SignalRecorderDeps } from './recorder.ts';
export { capacityOf, residentPoolOf } from './capacity.ts';
export type { CapacityInput } from './capacity.ts';
export { REFUSAL_CAUSES, figuresOf, meanOf, mergeBuckets, quantileOf, refusalsOf, seriesOf } from './figures.ts';
export { registerCapacityMetrics } from './metrics.ts';
export { recentCreates } from './recent.ts';

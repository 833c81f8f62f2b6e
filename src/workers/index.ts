export { WorkerHost } from './host.ts';
export type { WorkerHostDeps } from './host.ts';
export { decideAdmission } from './admission.ts';
export type { AdmissionState, AdmissionDecision } from './admission.ts';
export type { SandboxRuntime, SandboxRuntimeSpec, RuntimeExecSpec, RuntimeExecOutcome, RuntimeRawExecSpec, RuntimeRawExecOutcome } from './runtime/types.ts';

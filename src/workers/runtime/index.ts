export { BESTEFFORT_ROOT, createRuncRuntime } from './runtime.ts';
export type { RuncRuntime, RuncRuntimeDeps, RuntimeLogger } from './runtime.ts';
export { containerConfig, seccompProfile, DEFAULT_CAPABILITIES, MASKED_PATHS, READONLY_PATHS, INIT_ARGS, INIT_BUSYBOX } from './spec.ts';
export type { ContainerConfigInput } from './spec.ts';
export type { SandboxRuntime, SandboxRuntimeSpec, RuntimeExecSpec, RuntimeExecOutcome, RuntimeRawExecSpec, RuntimeRawExecOutcome } from './types.ts';

export { createRuncRuntime } from './runtime.ts';
export type { RuncRuntime } from './runtime.ts';
export type { RuncRuntimeDeps, RuntimeLogger } from './context.ts';
export { BESTEFFORT_ROOT } from './layout.ts';
export { CommandReleasedError, InitLostError } from './exec.ts';
export { containerConfig, seccompProfile, DEFAULT_CAPABILITIES, MASKED_PATHS, READONLY_PATHS, SANDBOX_INIT, SANDBOX_BUSYBOX } from './spec.ts';
export type { ContainerConfigInput } from './spec.ts';
export type { SandboxRuntime, SandboxRuntimeSpec, RuntimeExecSpec, RuntimeExecOutcome, RuntimeRawExecSpec, RuntimeRawExecOutcome } from './types.ts';

export { createMicroVmRuntime, unsupported, MIN_GUEST_MEMORY_MIB } from './runtime.ts';
export type { MicroVmRuntime, MicroVmRuntimeDeps } from './runtime.ts';
export { detectAccelerator, hostTscKhz } from './accelerator.ts';
export type { Accelerator } from './accelerator.ts';
export { microVmRuntimeOf, DEFAULT_VM_DIR } from './from-config.ts';
export { openVmChannel, muxFrame, MuxKind } from './channel.ts';
export type { VmChannel } from './channel.ts';

export { SandboxRegistry } from './store.ts';
export type { AdmitOutcome, TransitionOutcome, TransitionOptions } from './store.ts';
export { LayerRegistry } from './layers.ts';
export { PoolRegistry } from './pools.ts';
export { CommandLog } from './commands.ts';
export { OutputWriter, followOutput, readOutput } from './output.ts';
export type { OutputChunk, OutputRead } from './output.ts';
export { keys } from './keys.ts';

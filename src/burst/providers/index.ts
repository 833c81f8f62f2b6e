export { CommandProvider } from './command.ts';
export type { CommandProviderOptions } from './command.ts';
export { LocalProvider } from './local.ts';
export type { LocalProviderOptions } from './local.ts';
export type { CloudProvider, ProviderHost, ProvisionRequest } from './types.ts';

export { checkWorkerHost, checkWorkerHostOrThrow, checkCapabilities, WORKER_OWN_CAPABILITIES, NETWORK_CAPABILITIES } from './checks.ts';
export type { MissingRequirement, HostCheckOptions } from './checks.ts';
export { capabilitiesIn } from './capabilities.ts';

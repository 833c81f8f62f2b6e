export { startHollowHosts, HOLLOW_POOL } from './hosts.ts';
export type { HollowHosts, HollowHostsOptions } from './hosts.ts';
export { refuseOutsideBenchmarks } from './guard.ts';

import os from 'node:os';
import type { NodeHeartbeat } from '../api/index.ts';
import type { Config } from '../config/index.ts';
import { readPressure } from './admission.ts';
import type { LocalSandboxes } from './local-sandboxes.ts';

export interface HeartbeatInput {
  nodeId: string;
  config: Config['node'];
  atMs: number;
  healthy: boolean;
  /** False while the host starts (adopting, self-testing, syncing layers): placement skips it. */
  ready: boolean;
  /** Only for hosts that sync their layers first (cloud hosts). */
  syncedLayers?: string[];
  local: LocalSandboxes;
  diskCapacityMiB: number;
  cachedLayers: string[];
  network?: NodeHeartbeat['network'];
  pools?: NodeHeartbeat['pools'];
  tiers?: NodeHeartbeat['tiers'];
  portRelay?: string;
  /** The sandboxes' memory as last read from their cgroups (absent: not read yet). */
  memoryHeld?: { residentBytes: number; swappedBytes: number };
}

/** What a worker host tells the cluster about itself, about every second. */
export function heartbeatOf(input: HeartbeatInput): NodeHeartbeat {
  const { config, local } = input;
  return {
    nodeId: input.nodeId,
    pool: config.pool,
    atMs: input.atMs,
    healthy: input.healthy,
    ready: input.ready,
    ...(input.syncedLayers ? { syncedLayers: input.syncedLayers } : {}),
    capacity: { cpuMillis: config.cpuMillis, memoryMiB: config.memoryMiB, maxSandboxes: config.maxSandboxes, maxStarting: config.maxStarting, diskMiB: input.diskCapacityMiB },
    used: local.reserved(),
    measured: { cpuLoad: os.loadavg()[0]! / os.availableParallelism(), memoryUsedFraction: 1 - os.freemem() / os.totalmem(), pressure: readPressure() },
    sandboxes: local.size,
    starting: local.startingCount(),
    cachedLayers: input.cachedLayers,
    handledCreates: local.recentlyHandled(input.atMs),
    ...(input.memoryHeld ? { memory: { ...input.memoryHeld, ...local.givenBack() } } : {}),
    ...(input.network ? { network: input.network } : {}),
    ...(input.tiers ? { tiers: input.tiers } : {}),
    ...(input.portRelay ? { portRelay: input.portRelay } : {}),
    ...(input.pools && Object.keys(input.pools).length ? { pools: input.pools } : {}),
  };
}

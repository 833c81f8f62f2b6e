import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import type { Config } from '../../config/index.ts';
import type { TarExtractor } from '../../layers/index.ts';
import type { SandboxNetworks } from '../network/index.ts';
import type { LazyVmBlobs } from './lazy-blobs.ts';
import type { RuntimeLogger } from '../runtime/index.ts';
import { detectAccelerator, hostTscKhz } from './accelerator.ts';
import { createMicroVmRuntime, type MicroVmRuntime, type MicroVmRuntimeDeps } from './runtime.ts';

/** Where scripts/install-microvm.sh leaves the guest kernel and initramfs. */
export const DEFAULT_VM_DIR = path.resolve(import.meta.dirname, '../../../build/vm');

/**
 * The worker's microVM runtime, or why this host has none (ROLLBOX_MICROVM=off, QEMU or
 * the guest kernel missing): creates with `tier: microvm` are then refused, coded.
 */
/** What the runtime shares with the worker: its log, the sandbox networks, its extraction threads, its lazy layers. */
export interface MicroVmShared {
  logger?: RuntimeLogger;
  besteffortGuard?: MicroVmRuntimeDeps['besteffortGuard'];
  network?: SandboxNetworks;
  extract?: TarExtractor;
  lazy?: LazyVmBlobs;
}

export function microVmRuntimeOf(config: Config['node']['microvm'], dataDir: string, nodeId: string, shared: MicroVmShared = {}): { runtime?: MicroVmRuntime; why?: string } {
  const { logger } = shared;
  const found = findMicroVm(config, dataDir, nodeId, shared);
  if (found.why) logger?.info({ why: found.why }, 'no microvm tier on this host');
  else logger?.info({ accelerator: found.runtime!.accelerator }, 'microvm tier');
  return found;
}

function findMicroVm(config: Config['node']['microvm'], dataDir: string, nodeId: string, shared: MicroVmShared): { runtime?: MicroVmRuntime; why?: string } {
  if (config.mode === 'off') return { why: 'ROLLBOX_MICROVM=off' };
  const kernel = config.kernel ?? path.join(DEFAULT_VM_DIR, 'vmlinuz');
  const initramfs = config.initramfs ?? path.join(DEFAULT_VM_DIR, 'initramfs.cpio.gz');
  for (const file of [kernel, initramfs]) if (!fs.existsSync(file)) return { why: `${file} is missing (scripts/install-microvm.sh)` };
  try {
    execFileSync(config.qemuBinary, ['--version'], { stdio: 'ignore' });
  } catch {
    return { why: `${config.qemuBinary} does not run (apt package qemu-system-x86)` };
  }
  const accelerator = config.accelerator === 'auto' ? detectAccelerator() : config.accelerator;
  const tscKhz = accelerator === 'tcg' ? hostTscKhz() : undefined;
  const runtime = createMicroVmRuntime({ dataDir, nodeId, qemuBinary: config.qemuBinary, accelerator, kernel, initramfs, ramDir: path.join(config.ramDir, `rollbox-vm-ram-${nodeId}`), bootTimeoutMs: config.bootTimeoutMs, snapshotIdleTimeoutMs: config.snapshotIdleTimeoutMs, ...(config.returnMemory ? { returnMemory: config.returnMemory } : {}), ...(tscKhz ? { tscKhz } : {}), ...shared });
  return { runtime };
}

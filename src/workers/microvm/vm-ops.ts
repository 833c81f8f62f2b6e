import fs from 'node:fs/promises';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { DEFAULT_MAX_ENTRIES, LAYER_CHUNK_BYTES, type TarExtractor } from '../../layers/index.ts';
import type { SandboxNetworks } from '../network/index.ts';
import type { RuntimeLogger, RuntimeSnapshot, SandboxPolicy } from '../runtime/index.ts';
import { netnsPathOf, nicPolicy, VM_BRIDGE, vmNetnsOf } from './net.ts';
import { qmpCommand } from './qmp.ts';
import { setGuestFrozen, setGuestHiddenPaths } from './requests.ts';
import { snapshotVm } from './snapshot.ts';
import { serially, takesRequests, writeVmFile, type Vm } from './vm.ts';

export interface VmOpsDeps {
  network?: SandboxNetworks;
  /** Where a snapshot's tar is read into its EROFS layer (the worker's extraction threads, or this thread). */
  extract: TarExtractor;
  snapshotIdleTimeoutMs: number;
  logger?: RuntimeLogger;
  unsupported: (what: string) => RollboxError;
}

const qmpSocketOf = (vm: Vm): string => path.join(vm.dir, 'qmp.sock');

/** Whether QEMU runs the vCPUs (a pause stops them). */
async function vcpusRun(vm: Vm): Promise<boolean> {
  return ((await qmpCommand(qmpSocketOf(vm), 'query-status')) as { running?: boolean }).running === true;
}

/**
 * `fn` with the guest's vCPUs running: a paused VM is let run for it and stopped again
 * after. Its sandbox stays frozen in the guest meanwhile (pauseVm froze it first), so
 * only the guest's trusted side runs. `fn` is told whether the VM was paused.
 */
async function withGuestRunning<T>(vm: Vm, fn: (paused: boolean) => Promise<T>): Promise<T> {
  const paused = !(await vcpusRun(vm));
  if (paused) await qmpCommand(qmpSocketOf(vm), 'cont');
  try {
    return await fn(paused);
  } finally {
    if (paused) await qmpCommand(qmpSocketOf(vm), 'stop');
  }
}

/**
 * Pause: the sandbox frozen inside the guest (its cgroup freezer), then every vCPU stopped
 * (QMP `stop`; QEMU keeps the memory). The freeze first is what lets a later snapshot or
 * stage change run the guest's side of it without the sandbox's processes running.
 */
export function pauseVm(vm: Vm, deps: VmOpsDeps): Promise<void> {
  return serially(vm, async () => {
    if (takesRequests(vm)) await setGuestFrozen(vm.channel, true).catch((err: Error) => deps.logger?.warn({ sandboxId: vm.sandboxId, err: err.message }, 'microVM pause: the guest did not freeze its sandbox; stopping the vCPUs only'));
    await qmpCommand(qmpSocketOf(vm), 'stop');
  });
}

export function resumeVm(vm: Vm): Promise<void> {
  return serially(vm, async () => {
    await qmpCommand(qmpSocketOf(vm), 'cont');
    if (takesRequests(vm)) await setGuestFrozen(vm.channel, false);
  });
}

/** `/grader/` and `/grader` are one path; the whole root cannot be hidden. */
export function normalizeHiddenPaths(paths: readonly string[]): string[] {
  const normalized = [...new Set(paths.map((p) => path.posix.normalize(p).replace(/(.)\/$/, '$1')))];
  if (!normalized.every((p) => p.startsWith('/') && !p.includes('\0'))) throw new RollboxError('invalid_request', 'hidden paths must be absolute');
  if (normalized.includes('/')) throw new RollboxError('invalid_request', 'the sandbox\'s root (/) cannot be hidden');
  return normalized;
}

/** A VM booted by an older worker's initramfs: its guest has no side for `what`. */
function requireRequests(vm: Vm, deps: Pick<VmOpsDeps, 'unsupported'>, what: string): void {
  if (!takesRequests(vm)) throw deps.unsupported(`${what} in a VM booted by an older worker (its guest takes no requests; a new VM does)`);
}

/** At create (before the first command) and after a wake: the guest hides exactly these. */
export async function hidePaths(vm: Vm, paths: readonly string[], deps: Pick<VmOpsDeps, 'unsupported'>): Promise<void> {
  const hidden = normalizeHiddenPaths(paths);
  if (!takesRequests(vm)) {
    if (hidden.length) requireRequests(vm, deps, 'hide paths (hiddenPaths)');
    return;
  }
  await setGuestHiddenPaths(vm.channel, hidden);
  vm.file = { ...vm.file, hiddenPaths: hidden };
  await writeVmFile(vm);
}

/**
 * A task stage: hidden paths first (a refusal, such as a symlink, changes nothing), then
 * the network; should the network part fail, the hidden paths go back as they were.
 */
export function applyVmPolicy(vm: Vm, change: Partial<SandboxPolicy>, deps: VmOpsDeps): Promise<SandboxPolicy> {
  return serially(vm, async () => {
    const before = vm.file.hiddenPaths ?? [];
    const hidden = change.hiddenPaths ? normalizeHiddenPaths(change.hiddenPaths) : before;
    const network = change.network ?? vm.file.network ?? { mode: 'none', allow: [] };
    // A virtio-mmio NIC cannot be added to a running microvm machine.
    if (change.network && network.mode === 'allowlist' && !vm.file.nic) throw deps.unsupported('give a network to a sandbox created without one (network.mode none at create)');
    const hiddenChanged = hidden.length !== before.length || hidden.some((p, i) => p !== before[i]);
    if (hiddenChanged) requireRequests(vm, deps, 'hide paths (hiddenPaths)');
    if (hiddenChanged) await withGuestRunning(vm, () => setGuestHiddenPaths(vm.channel, hidden));
    if (change.network && vm.file.nic) {
      try {
        await deps.network!.apply(vm.sandboxId, netnsPathOf(vmNetnsOf(vm.sandboxId)), nicPolicy(network), { bridge: VM_BRIDGE });
      } catch (err) {
        if (hiddenChanged) {
          await withGuestRunning(vm, () => setGuestHiddenPaths(vm.channel, before)).catch((undoErr: Error) =>
            deps.logger?.warn({ sandboxId: vm.sandboxId, err: undoErr.message }, 'could not restore hidden paths after a failed stage change'),
          );
        }
        throw err;
      }
    }
    vm.file = { ...vm.file, ...(change.network ? { network } : {}), hiddenPaths: hidden };
    await writeVmFile(vm);
    return { network, hiddenPaths: hidden };
  });
}

/**
 * pack_diff (snapshot.ts): the guest streams its writable layer into a split EROFS layer
 * at `<outPath>.meta` + `<outPath>.blob`. A paused VM is packed frozen as it is (frozenMs 0).
 */
export function snapshotOfVm(vm: Vm, options: { outPath: string; excludePaths: readonly string[] }, deps: VmOpsDeps): Promise<RuntimeSnapshot> {
  requireRequests(vm, deps, 'snapshot its writable disk (pack_diff)');
  return serially(vm, () =>
    withGuestRunning(vm, async (paused) => {
      const files = { metaPath: `${options.outPath}.meta`, blobPath: `${options.outPath}.blob`, chunkSizeBytes: LAYER_CHUNK_BYTES };
      const removeFiles = async (): Promise<void> => {
        await Promise.all([files.metaPath, files.blobPath].map((f) => fs.rm(f, { force: true })));
      };
      // Its upper dir cannot hold more than its disk (a sparse file's holes aside: see docs/microvm.md).
      const maxBytes = (await fs.stat(path.join(vm.dir, 'disk.ext4'))).size;
      const snap = await snapshotVm(vm.channel, files, { excludePaths: options.excludePaths, held: paused, removeFiles }, { maxBytes, maxEntries: DEFAULT_MAX_ENTRIES, idleTimeoutMs: deps.snapshotIdleTimeoutMs }, deps.extract);
      deps.logger?.info({ sandboxId: vm.sandboxId, frozenMs: snap.frozenMs, firstByteMs: Math.round(snap.firstByteMs), streamMs: Math.round(snap.streamMs), tarBytes: snap.tarBytes, entries: snap.entries, skipped: snap.skipped }, 'microVM snapshot');
      return { frozenMs: snap.frozenMs, split: { ...files, table: snap.table } };
    }),
  );
}

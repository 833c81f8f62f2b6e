import { RollboxError } from '../../api/index.ts';
import type { SandboxRuntime } from './types.ts';

/** A tier's runtime that can say which sandboxes are its own. */
export interface TierRuntime extends SandboxRuntime {
  has(sandboxId: string): boolean;
}

/**
 * The worker's one SandboxRuntime over both tiers: a create goes to the runtime of its
 * `tier`, every later call to the runtime holding that sandbox. Nothing outside this
 * module (and the tiers themselves) looks at the tier.
 */
export function createTieredRuntime(container: SandboxRuntime, microvm: TierRuntime | undefined): SandboxRuntime {
  const of = (id: string): SandboxRuntime => (microvm?.has(id) ? microvm : container);
  const both = microvm ? [container, microvm] : [container];
  return {
    create: (spec) => (spec.tier === 'microvm' ? (microvm ?? noMicroVm()) : container).create(spec),
    exec: (id, spec) => of(id).exec(id, spec),
    attach: (id, spec) => of(id).attach(id, spec),
    signalCommand: (id, commandId, signo) => of(id).signalCommand(id, commandId, signo),
    writeCommandStdin: (id, commandId, data, eof) => of(id).writeCommandStdin(id, commandId, data, eof),
    resizeCommand: (id, commandId, size) => of(id).resizeCommand(id, commandId, size),
    execRaw: (id, spec) => of(id).execRaw(id, spec),
    claim: (id, binding) => of(id).claim(id, binding),
    destroy: (id) => of(id).destroy(id),
    applyPolicy: (id, change) => of(id).applyPolicy(id, change),
    pause: (id) => of(id).pause(id),
    swapOut: (id) => of(id).swapOut(id),
    async memoryHeld() {
      const held = await Promise.all(both.map((r) => r.memoryHeld()));
      const sum = (of: (h: (typeof held)[number]) => number) => held.reduce((total, h) => total + of(h), 0);
      return { residentBytes: sum((h) => h.residentBytes), swappedBytes: sum((h) => h.swappedBytes), guestUnbackedBytes: sum((h) => h.guestUnbackedBytes ?? 0) };
    },
    resume: (id) => of(id).resume(id),
    snapshot: (id, options) => of(id).snapshot(id, options),
    makeForkPoint: (id, forkPointId) => of(id).makeForkPoint(id, forkPointId),
    // Fork points are container disks (a microVM answers makeForkPoint with undefined).
    packForkPoint: (forkPointId, outPath) => container.packForkPoint(forkPointId, outPath),
    removeForkPoint: (forkPointId) => container.removeForkPoint(forkPointId),
    hibernatesWhole: (id) => of(id).hibernatesWhole(id),
    hibernateWhole: (id, imageDir) => of(id).hibernateWhole(id, imageDir),
    forkWhole: (id, imageDir, children) => of(id).forkWhole(id, imageDir, children),
    isRunning: (id) => of(id).isRunning(id),
    onExit(listener) {
      for (const r of both) r.onExit(listener);
    },
    detach() {
      for (const r of both) r.detach();
    },
    oomKillCount: (id) => of(id).oomKillCount(id),
    exitCause: (id) => of(id).exitCause(id),
    async reconcile(keep) {
      // The microVMs first: what they adopt is not the container runtime's to miss.
      const vms = microvm ? await microvm.reconcile(keep) : { adopted: [], removed: [], missing: [] };
      const rest = new Set([...keep].filter((id) => !vms.adopted.includes(id)));
      const containers = await container.reconcile(rest);
      return { adopted: [...containers.adopted, ...vms.adopted], removed: [...containers.removed, ...vms.removed], missing: containers.missing };
    },
    mountedLayers: () => container.mountedLayers(),
    sandboxesUsingLayers: (digests) => both.flatMap((r) => r.sandboxesUsingLayers(digests)),
    unmountUnused: (digests) => container.unmountUnused(digests),
    diskSpace: () => container.diskSpace(),
    metrics: (id) => of(id).metrics(id),
    netnsPidOf: (id) => of(id).netnsPidOf(id),
  };
}

function noMicroVm(): never {
  throw new RollboxError('tier_unsupported', 'this worker host has no microvm tier (QEMU or the guest kernel is missing: scripts/install-microvm.sh)');
}

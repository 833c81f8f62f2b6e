import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { RollboxError, type CreateSandboxRequest, type Resources, type Sandbox } from '../api/index.ts';
import type { LayerStore } from '../layers/index.ts';
import type { SandboxRegistry } from '../registry/index.ts';
import type { ForkPoint } from './fork-point.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';

export interface VmForkDeps {
  registry: Pick<SandboxRegistry, 'getOwned'>;
  nodes: Pick<NodeRequests, 'sendOp'>;
  store: Pick<LayerStore, 'linkForkImage' | 'forkImageDirOf'>;
}

/** A save of a VM whole: its device state, its RAM (a few hundred MiB) and disk copied. */
const SAVE_REPLY_TIMEOUT_MS = 120_000;

/** A microVM keeps its processes when it forks, unless asked not to (or hibernated as a layer, by a worker older than whole hibernation). */
export function keepsProcessesByDefault(parent: Sandbox): boolean {
  return parent.spec.tier === 'microvm' && !(parent.state === 'hibernated' && !parent.hibernatedWhole);
}

const vcpusOf = (r: Resources): number => Math.max(1, Math.ceil(r.cpuMillis / 1000));

/**
 * A child restored from its parent's saved VM has the parent's guest memory, vCPUs and disk
 * (the machine QEMU restores must be the one it saved); its CPU quota (within those vCPUs),
 * pids limit and reservation (`requests`) are its own. Checked before the parent is stopped.
 */
function checkChildResources(parent: Sandbox, child: Resources): void {
  const p = parent.spec.resources;
  const differs = [
    child.memoryMiB !== p.memoryMiB ? `memoryMiB ${child.memoryMiB} (the parent's: ${p.memoryMiB})` : '',
    vcpusOf(child) !== vcpusOf(p) ? `${vcpusOf(child)} vCPUs from cpuMillis ${child.cpuMillis} (the parent's: ${vcpusOf(p)}, cpuMillis ${(vcpusOf(p) - 1) * 1000 + 1}-${vcpusOf(p) * 1000})` : '',
    child.diskMiB !== p.diskMiB ? `diskMiB ${child.diskMiB} (the parent's: ${p.diskMiB})` : '',
  ].filter(Boolean);
  if (differs.length) {
    throw new RollboxError('invalid_request', `a child that keeps its parent's processes is the parent's VM restored, with its memory, vCPUs and disk: ${differs.join('; ')}. Ask for the parent's, or fork with processes: false (files only, fresh VMs of any size)`);
  }
}

/**
 * The fork point of a fork that keeps processes: the microVM parent saved whole into the
 * layer store's image `fp` (LayerStore.forkImageDirOf), which every child is restored from.
 * Running or paused: its host saves it (stopped only for that: `frozenMs`; a paused one stays
 * paused). Hibernated whole: its saved image is that state already, linked as the fork's
 * without waking it (nothing stopped: no frozenMs); should it wake meanwhile, it is saved as
 * it runs. The caller removes the image once the children have started.
 */
export async function vmForkPointOf(deps: VmForkDeps, parent: Sandbox, fp: string, spec: CreateSandboxRequest, snapshotAsked: boolean): Promise<ForkPoint> {
  if (parent.spec.tier !== 'microvm') throw new RollboxError('tier_unsupported', `sandbox ${parent.id} is a container: the container tier forks files, not processes (CRIU does not work on this kernel); fork with processes: false, or use the microvm tier`);
  if (snapshotAsked) throw new RollboxError('invalid_request', 'a fork that keeps processes saves the VM whole, not a layer: snapshot it beside the fork (POST /v1/sandboxes/:id/snapshot), or fork with processes: false');
  checkChildResources(parent, spec.resources);
  const childrenNic = spec.network.mode === 'allowlist';
  const base = { parent: parent.id, parentKind: 'sandbox' as const, parentLayers: parent.layerDigests, packed: () => false };
  const layer = async (): Promise<string> => {
    throw new RollboxError('internal', 'a fork that keeps processes has no fork layer');
  };
  let current = parent;
  for (let attempt = 0; ; attempt++) {
    if (current.state === 'hibernated' && current.hibernatedWhole) {
      if (await deps.store.linkForkImage(current.id, fp)) {
        // A NIC cannot be added to a restored machine: the saved one has one or not (hibernation.ts vm.json).
        const saved = JSON.parse(await readFile(path.join(deps.store.forkImageDirOf(fp), 'vm.json'), 'utf8')) as { nic?: boolean };
        if (childrenNic && !saved.nic) throw new RollboxError('tier_unsupported', `sandbox ${parent.id} has no network device (network.mode none at create): its children cannot have one. Fork with processes: false for fresh VMs with a NIC`);
        return { ...base, layer, processes: { id: fp, detachedCommands: [] } };
      }
      if (attempt > 0) throw new RollboxError('conflict', `sandbox ${parent.id} changed state while it was forked; send the fork again`);
      // It woke meanwhile (its image is gone): saved as it runs now.
      current = await deps.registry.getOwned(parent.id, parent.tenant);
      continue;
    }
    if (current.state !== 'running' && current.state !== 'paused') {
      const why = current.state === 'pending' || current.state === 'creating' ? 'it has not started yet' : 'it is ending or ended';
      throw new RollboxError('invalid_state', `sandbox ${parent.id} is ${current.state}; only a running, paused or hibernated sandbox forks (${why})`);
    }
    const requestId = `${fp}-save-${Math.random().toString(36).slice(2, 8)}`;
    const reply = await deps.nodes.sendOp(current.node!, { kind: 'fork_point', action: 'save', sandboxId: parent.id, forkPointId: fp, requestId, childrenNic }, SAVE_REPLY_TIMEOUT_MS);
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    if (reply.kind !== 'fork_point' || !reply.saved) throw new RollboxError('internal', `unexpected reply ${reply.kind} to a fork's save`);
    return { ...base, layer, ...(reply.frozenMs !== undefined ? { frozenMs: reply.frozenMs } : {}), processes: { id: fp, detachedCommands: reply.detachedCommands ?? [] } };
  }
}

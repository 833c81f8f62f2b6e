/**
 * bench:fork's microVM arm: a microVM with 64 MiB of its memory touched (written to its
 * /dev/shm) and a counting background process, forked into N children that keep its
 * processes (`processes: true`: one save of the VM, restored N times), beside a container
 * with 64 MiB written in 1,000 files forked into N (files only) in the same run. Per N:
 * time until every child runs (the fork's answer: it waits for each child's start), the
 * parent's frozen time, and the microVM's per-child restore cost. Under TCG (no VT-x here)
 * the microVM figures say nothing about KVM hosts.
 */
import { api, type TestCluster } from '../../test/support/cluster.ts';
import { summarize } from '../../src/report/index.ts';
import { timed } from './runc-floor.ts';

export interface VmForkCell {
  children: number;
  vmForkMs: number;
  vmParentFrozenMs: number;
  /** vmForkMs / children: what each child added (the save is paid once). */
  vmPerChildMs: number;
  containerForkMs: number;
  containerParentFrozenMs: number;
  ratioVmToContainer: number;
}

const TOUCHED_MIB = 64;
const FILES = 1000;

export async function microVmForkArm(cluster: TestCluster, token: string, counts: number[], runs: number, onRun: () => void): Promise<VmForkCell[]> {
  const call = async (method: string, urlPath: string, body?: unknown) => {
    const r = await api(cluster, token, method, urlPath, body);
    if (r.status >= 300) throw new Error(`${method} ${urlPath}: ${r.status} ${JSON.stringify(r.body)}`);
    return r.body;
  };
  const removeAll = async (ids: string[]) => {
    for (let i = 0; i < ids.length; i += 8) await Promise.all(ids.slice(i, i + 8).map((id) => call('DELETE', `/v1/sandboxes/${id}`)));
  };
  const vm = await call('POST', '/v1/sandboxes', { tier: 'microvm', resources: { memoryMiB: 256, cpuMillis: 1000 } });
  await call('POST', `/v1/sandboxes/${vm.id}/exec`, { cmd: `head -c ${TOUCHED_MIB << 20} /dev/urandom > /dev/shm/touched; (i=0; while :; do i=$((i+1)); echo $i > /tmp/beat; sleep 0.2; done) </dev/null >/dev/null 2>&1 &`, timeoutMs: 120_000 });
  const container = await call('POST', '/v1/sandboxes', { resources: { memoryMiB: 256, diskMiB: TOUCHED_MIB * 2 + 128 } });
  const fileBytes = Math.floor((TOUCHED_MIB << 20) / FILES);
  await call('POST', `/v1/sandboxes/${container.id}/exec`, { cmd: `mkdir /data && i=0; while [ $i -lt ${FILES} ]; do head -c ${fileBytes} /dev/urandom > /data/f$i; i=$((i+1)); done`, timeoutMs: 300_000 });
  const cells: VmForkCell[] = [];
  try {
    for (const n of counts) {
      const vmMs: number[] = [];
      const vmFrozen: number[] = [];
      const ctMs: number[] = [];
      const ctFrozen: number[] = [];
      for (let run = 0; run < runs; run++) {
        for (const [parent, ms, frozen] of [[vm.id, vmMs, vmFrozen], [container.id, ctMs, ctFrozen]] as const) {
          let result: { children: { id?: string; state?: string }[]; parentFrozenMs?: number; created: number; processes: boolean } | undefined;
          ms.push(await timed(async () => (result = await call('POST', `/v1/sandboxes/${parent}/fork`, { count: n }))));
          if (result!.created !== n) throw new Error(`fork of ${parent} made ${result!.created} of ${n} children: ${JSON.stringify(result!.children.find((c) => c.state !== 'running'))}`);
          frozen.push(result!.parentFrozenMs ?? 0);
          await removeAll(result!.children.map((c) => c.id!));
        }
        onRun();
      }
      const p50 = (xs: number[]) => summarize(xs).p50Ms;
      const cell = {
        children: n,
        vmForkMs: Math.round(p50(vmMs)),
        vmParentFrozenMs: Math.round(p50(vmFrozen) * 10) / 10,
        vmPerChildMs: Math.round(p50(vmMs) / n),
        containerForkMs: Math.round(p50(ctMs)),
        containerParentFrozenMs: Math.round(p50(ctFrozen) * 10) / 10,
        ratioVmToContainer: Math.round((p50(vmMs) / p50(ctMs)) * 100) / 100,
      };
      cells.push(cell);
      console.error(JSON.stringify({ microvm: cell }));
    }
  } finally {
    await removeAll([vm.id, container.id]);
  }
  return cells;
}

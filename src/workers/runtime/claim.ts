import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import type { RuntimeContext } from './context.ts';
import { NO_NETWORK, applyPolicy } from './policy.ts';
import { CPU_PERIOD_US, cpuShares } from './spec.ts';
import type { SandboxBinding } from './types.ts';

/** What a claim bound (env, workdir, user), kept in the bundle so a restarted worker adopts it. */
const CLAIM_FILE = 'claim.json';
const MIB = 1024 * 1024;

/**
 * A ready sandbox of a warm pool becomes a tenant's: its limits (written to its cgroups,
 * as `runc update` would, without a runc process), its env and workdir (every command
 * gets them), then its hidden paths and network as a task stage would apply them. Until
 * then it ran nothing but its init, with no network.
 */
export async function claimSandbox(ctx: RuntimeContext, id: string, binding: SandboxBinding): Promise<void> {
  const rec = ctx.sandboxes.get(id);
  if (!rec) throw new RollboxError('not_found', `sandbox ${id} is not on this host`);
  await ctx.locked(id, async () => {
    const cg = await ctx.cgroups();
    const rel = ctx.cgroupRel(id);
    const { memoryMiB, cpuMillis, pids } = binding.resources;
    const memory = path.join(cg.memory, rel);
    // The swap limit may never be below the memory limit: raise it first, lower it last.
    const memoryFiles = cg.memsw ? ['memory.limit_in_bytes', 'memory.memsw.limit_in_bytes'] : ['memory.limit_in_bytes'];
    const raising = memoryMiB * MIB > Number(readFileSync(path.join(memory, 'memory.limit_in_bytes'), 'utf8'));
    for (const file of raising ? [...memoryFiles].reverse() : memoryFiles) writeFileSync(path.join(memory, file), String(memoryMiB * MIB));
    writeFileSync(path.join(cg.pids, rel, 'pids.max'), String(pids));
    if (cg.cpu) {
      const quotaUs = cpuMillis * (CPU_PERIOD_US / 1000);
      writeFileSync(path.join(cg.cpu, rel, 'cpu.shares'), String(cpuShares(binding.resources, rec.besteffort ? 'besteffort' : 'latency')));
      // The burst may never exceed the quota: cleared before the quota changes, set after (create.ts says why a latency sandbox has one).
      const burstFile = path.join(cg.cpu, rel, 'cpu.cfs_burst_us');
      const bursts = existsSync(burstFile);
      if (bursts) writeFileSync(burstFile, '0');
      writeFileSync(path.join(cg.cpu, rel, 'cpu.cfs_quota_us'), String(quotaUs));
      if (bursts && !rec.besteffort) writeFileSync(burstFile, String(quotaUs));
    }
    // The bundle's config says what the sandbox is now (adoption reads its CPU quota back).
    const configFile = path.join(ctx.layout.bundleOf(id), 'config.json');
    const config = JSON.parse(readFileSync(configFile, 'utf8')) as { linux?: { resources?: Record<string, Record<string, unknown>> } };
    const resources = config.linux?.resources;
    if (resources?.memory) resources.memory = { ...resources.memory, limit: memoryMiB * MIB, ...(cg.memsw ? { swap: memoryMiB * MIB } : {}) };
    if (resources?.cpu) resources.cpu = { ...resources.cpu, quota: cpuMillis * (CPU_PERIOD_US / 1000) };
    if (resources?.pids) resources.pids = { limit: pids };
    writeFileSync(configFile, JSON.stringify(config));
    rec.env = binding.env;
    rec.workdir = binding.workdir;
    rec.user = binding.user;
    writeFileSync(path.join(ctx.layout.bundleOf(id), CLAIM_FILE), JSON.stringify({ env: binding.env, workdir: binding.workdir, user: binding.user }));
  });
  await applyPolicy(ctx, id, { hiddenPaths: binding.hiddenPaths, network: binding.network ?? NO_NETWORK });
}

/** A claimed sandbox's env, workdir and user, for adoption (undefined: created for itself). */
export function readClaim(ctx: RuntimeContext, id: string): { env: Record<string, string>; workdir: string; user?: string } | undefined {
  try {
    return JSON.parse(readFileSync(path.join(ctx.layout.bundleOf(id), CLAIM_FILE), 'utf8')) as { env: Record<string, string>; workdir: string; user?: string };
  } catch {
    return undefined;
  }
}

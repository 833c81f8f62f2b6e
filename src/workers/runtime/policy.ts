import { existsSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { RollboxError, hasNetwork, type NetworkPolicy } from '../../api/index.ts';
import { HOSTS_FILE } from '../../layers/index.ts';
import { setFreezerState } from './cgroups.ts';
import type { RuntimeContext } from './context.ts';
import { inMountNamespace, mountPointsOf, type MountNsOp } from './mountns.ts';
import { MASKED_PATHS } from './spec.ts';
import type { SandboxPolicy } from './types.ts';

export const NO_NETWORK: NetworkPolicy = { mode: 'none', allow: [] };
/** The sandbox's current stage policy (network, hidden paths), kept in its bundle for adoption. */
const POLICY_FILE = 'policy.json';

export function writePolicy(ctx: RuntimeContext, id: string, policy: SandboxPolicy): void {
  writeFileSync(path.join(ctx.layout.bundleOf(id), POLICY_FILE), JSON.stringify(policy));
}

export async function readPolicy(ctx: RuntimeContext, id: string): Promise<SandboxPolicy> {
  const bundle = ctx.layout.bundleOf(id);
  const stored = await readFile(path.join(bundle, POLICY_FILE), 'utf8').catch(() => '');
  if (stored) return JSON.parse(stored) as SandboxPolicy;
  // A sandbox from before stage changes existed: its create-time hidden paths.
  const masked = (JSON.parse(await readFile(path.join(bundle, 'config.json'), 'utf8')) as { linux?: { maskedPaths?: string[] } }).linux?.maskedPaths ?? [];
  return { network: NO_NETWORK, hiddenPaths: masked.filter((p) => !(MASKED_PATHS as readonly string[]).includes(p)) };
}

/**
 * Network rules, then the sandbox's resolv.conf pointing at the platform's resolver, and the
 * names it may resolve (its allowlist's, the gateway's for an agent sandbox) in its
 * /etc/hosts, as Docker writes a container's: the resolver lives in the worker process, and
 * a command that outlives its worker must still resolve them. The addresses are the ones the
 * rules let through, as the resolver answers.
 */
export async function applyNetwork(ctx: RuntimeContext, id: string, pid: number, network: NetworkPolicy): Promise<void> {
  if (hasNetwork(network) && !ctx.network) throw new RollboxError('invalid_request', 'a sandbox network (allowlist, gateway) is not available on this worker host');
  if (!ctx.network) return;
  await ctx.network.apply(id, pid, network);
  const resolver = ctx.network.resolverOf(id);
  if (!resolver) return;
  const hosts = [...ctx.network.namesOf(id)].flatMap(([name, addresses]) => addresses.map((address) => `${address}\t${name}\n`));
  const writes: MountNsOp[] = [
    { op: 'write', path: '/etc/resolv.conf', content: `nameserver ${resolver}\n` },
    { op: 'write', path: '/etc/hosts', content: HOSTS_FILE + hosts.join('') },
  ];
  // Best effort: an agent that replaced a file with something else (or a stage that hid it)
  // loses the names from there on.
  await inMountNamespace(pid, writes, ctx.perlBinary).catch((err: unknown) => ctx.log?.warn({ sandboxId: id, err: String(err) }, 'could not write the platform\'s names into the sandbox'));
}

/**
 * A task stage change: paths are hidden or revealed inside the running sandbox, with its
 * processes frozen so nothing races the change, then the network policy is replaced
 * atomically. Only paths rollbox hid are ever revealed (runc's masked defaults never are).
 */
export async function applyPolicy(ctx: RuntimeContext, id: string, change: Partial<SandboxPolicy>): Promise<SandboxPolicy> {
  if (!ctx.sandboxes.has(id)) throw new RollboxError('not_found', `sandbox ${id} is not on this host`);
  return ctx.locked(id, async () => {
    const pid = await ctx.initPidOf(id);
    const current = await readPolicy(ctx, id);
    // `/grader/` and `/grader` are one mount point.
    const normalized = change.hiddenPaths?.map((p) => path.posix.normalize(p).replace(/(.)\/$/, '$1'));
    const next: SandboxPolicy = { network: change.network ?? current.network, hiddenPaths: [...new Set(normalized ?? current.hiddenPaths)] };
    if (!next.hiddenPaths.every((p) => p.startsWith('/') && !p.includes('\0'))) throw new RollboxError('invalid_request', 'hidden paths must be absolute');
    // Hidden paths first: their failures come from the request (a symlink), and then
    // nothing changed. Should the network part fail after them (e.g. a name that does not
    // resolve), they are changed back: a stage change applies whole or not at all.
    await changeHiddenPaths(ctx, id, pid, current.hiddenPaths, next.hiddenPaths);
    if (change.network) {
      try {
        await applyNetwork(ctx, id, pid, next.network);
      } catch (err) {
        await changeHiddenPaths(ctx, id, pid, next.hiddenPaths, current.hiddenPaths).catch((undoErr: unknown) =>
          ctx.log?.warn({ sandboxId: id, err: String(undoErr) }, 'could not restore hidden paths after a failed stage change'),
        );
        throw err;
      }
    }
    writePolicy(ctx, id, next);
    return next;
  });
}

/** Hide and reveal inside the running sandbox, its processes frozen meanwhile. */
async function changeHiddenPaths(ctx: RuntimeContext, id: string, pid: number, from: readonly string[], to: readonly string[]): Promise<void> {
  // Only rollbox-hidden paths are ever revealed, never runc's masked defaults.
  const reveal = from.filter((p) => !to.includes(p) && !(MASKED_PATHS as readonly string[]).includes(p));
  const hide = to.filter((p) => !from.includes(p));
  if (!reveal.length && !hide.length) return;
  const stateFile = await freezerStateFile(ctx, id);
  const wasFrozen = (await readFile(stateFile, 'utf8')).trim() === 'FROZEN';
  if (!wasFrozen) await setFreezerState(stateFile, 'FROZEN');
  try {
    // Reveal only what is a mount point at exactly that path (what we or runc mounted).
    const mounted = await mountPointsOf(pid);
    const ops: MountNsOp[] = [...reveal.filter((p) => mounted.has(p)).map((p) => ({ op: 'reveal' as const, path: p })), ...hide.map((p) => ({ op: 'hide' as const, path: p }))];
    await inMountNamespace(pid, ops, ctx.perlBinary);
  } finally {
    if (!wasFrozen) await setFreezerState(stateFile, 'THAWED');
  }
}

export async function freezerStateFile(ctx: RuntimeContext, id: string): Promise<string> {
  return path.join((await ctx.cgroups()).freezer, ctx.cgroupRel(id), 'freezer.state');
}

/**
 * Freeze or thaw every process of the sandbox (its init included) with the cgroup
 * freezer: CPU time stops advancing while memory, files and processes stay. Written
 * directly (as `runc pause` does, and runc reads its status from the same file) to save
 * a runc process per call.
 */
export async function setFrozen(ctx: RuntimeContext, id: string, frozen: boolean): Promise<void> {
  const stateFile = await freezerStateFile(ctx, id);
  if (!existsSync(stateFile)) throw new RollboxError('not_found', `sandbox ${id} has no freezer cgroup on this host`);
  await setFreezerState(stateFile, frozen ? 'FROZEN' : 'THAWED');
}

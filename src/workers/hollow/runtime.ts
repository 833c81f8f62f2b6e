import { RollboxError } from '../../api/index.ts';
import type { RuntimeAttachSpec, RuntimeExecOutcome, RuntimeExecSpec, RuntimeRawExecOutcome, RuntimeSnapshot, SandboxExit, SandboxPolicy, SandboxRuntime, SandboxRuntimeSpec } from '../runtime/types.ts';

/** What a hollow host refuses: anything that would need a real sandbox's files or processes. */
function hollowRefuses(what: string): never {
  throw new RollboxError('invalid_request', `a hollow worker host (benchmarks only) has no ${what}`);
}

/**
 * A runtime that starts nothing: a create records the id, an exec answers at once (`echo`
 * echoes its arguments, anything else succeeds silently), a destroy forgets. It stands in
 * for runc under the real worker host code (heartbeats, admission, inboxes, BullMQ
 * consumers, audit, reconcile) so that the control plane can meet hundreds of hosts on
 * one machine (kubemark's hollow nodes). Only startHollowHosts makes one, and only in a
 * benchmark process (guard.ts).
 */
export class HollowRuntime implements SandboxRuntime {
  private readonly live = new Set<string>();
  /** The sandboxes this host holds now. */
  ids(): string[] {
    return [...this.live];
  }

  async create(spec: SandboxRuntimeSpec): Promise<void> {
    this.live.add(spec.sandboxId);
  }

  async exec(sandboxId: string, spec: RuntimeExecSpec): Promise<RuntimeExecOutcome> {
    this.require(sandboxId);
    const [program, ...args] = spec.argv;
    const outcome: RuntimeExecOutcome = { exitCode: 0, stdout: program === 'echo' ? `${args.join(' ')}\n` : '', stderr: '', truncated: false, timedOut: false, oomKilled: false, oomKills: 0, durationMs: 0 };
    if (outcome.stdout) spec.onOutput?.('stdout', Buffer.from(outcome.stdout));
    // As the real runtime does: the result is recorded before the command is let go.
    await spec.record?.(outcome);
    return outcome;
  }

  async attach(_sandboxId: string, _spec: RuntimeAttachSpec): Promise<RuntimeExecOutcome | undefined> {
    return undefined; // nothing outlives a hollow command
  }

  async signalCommand(): Promise<boolean> {
    return false;
  }

  async writeCommandStdin(): Promise<boolean> {
    return false;
  }

  async resizeCommand(): Promise<boolean> {
    return false;
  }

  async execRaw(): Promise<RuntimeRawExecOutcome> {
    return hollowRefuses('files');
  }

  async claim(sandboxId: string): Promise<void> {
    this.require(sandboxId);
  }

  async destroy(sandboxId: string): Promise<void> {
    this.live.delete(sandboxId);
  }

  async applyPolicy(sandboxId: string, change: Partial<SandboxPolicy>): Promise<SandboxPolicy> {
    this.require(sandboxId);
    return { network: change.network ?? { mode: 'none', allow: [] }, hiddenPaths: change.hiddenPaths ?? [] };
  }

  async pause(sandboxId: string): Promise<void> {
    this.require(sandboxId);
  }

  async resume(sandboxId: string): Promise<void> {
    this.require(sandboxId);
  }

  async swapOut(): Promise<{ residentBytes: number; swappedBytes: number }> {
    return hollowRefuses('swap');
  }

  async memoryHeld(): Promise<{ residentBytes: number; swappedBytes: number }> {
    return { residentBytes: 0, swappedBytes: 0 };
  }

  async snapshot(): Promise<RuntimeSnapshot> {
    return hollowRefuses('writable layer to snapshot');
  }

  async makeForkPoint(): Promise<undefined> {
    return undefined;
  }

  async packForkPoint(): Promise<void> {
    hollowRefuses('fork points');
  }

  removeForkPoint(): void {}

  hibernatesWhole(): boolean {
    return false;
  }

  async hibernateWhole(): Promise<{ carriedCommands: string[] }> {
    return hollowRefuses('memory to save');
  }

  async forkWhole(): Promise<{ frozenMs: number; detachedCommands: string[] }> {
    return hollowRefuses('processes to fork');
  }

  async isRunning(sandboxId: string): Promise<boolean> {
    return this.live.has(sandboxId);
  }

  onExit(): void {} // a hollow sandbox never dies by itself

  detach(): void {}

  async oomKillCount(): Promise<number> {
    return 0;
  }

  async exitCause(): Promise<SandboxExit> {
    return { reason: 'init_lost', detail: 'hollow sandbox forgotten' };
  }

  async reconcile(keep: ReadonlySet<string>): Promise<{ adopted: string[]; removed: string[]; missing: string[] }> {
    const adopted = [...keep].filter((id) => this.live.has(id));
    const removed = [...this.live].filter((id) => !keep.has(id));
    for (const id of removed) this.live.delete(id);
    return { adopted, removed, missing: [...keep].filter((id) => !this.live.has(id)) };
  }

  mountedLayers(): string[] {
    return [];
  }

  sandboxesUsingLayers(): string[] {
    return [];
  }

  async unmountUnused(): Promise<void> {}

  diskSpace(): { sizeMiB: number; freeMiB: number; preallocated: boolean } {
    // Room that never runs out: a hollow host's limits are its memory, CPU and count.
    return { sizeMiB: 1 << 30, freeMiB: 1 << 30, preallocated: false };
  }

  async metrics(): Promise<never> {
    return hollowRefuses('cgroups to read');
  }

  async netnsPidOf(): Promise<never> {
    return hollowRefuses('network namespaces');
  }

  private require(sandboxId: string): void {
    if (!this.live.has(sandboxId)) throw new RollboxError('invalid_state', `hollow sandbox ${sandboxId} is not on this host`);
  }
}

import { RollboxError } from '../../api/index.ts';

/**
 * What the microVM tier needs of the host's lazy layers (src/layers/lazy LazyLayers): a VM's
 * QEMU reads a lazy layer's data blob, the sparse file of the host's chunk cache, through
 * virtio-blk. The gate's fanotify mark is on that file's inode, so QEMU's reads of missing
 * chunks wait for them (fetched, checked by digest, written into the same file for every
 * sandbox of the host) like a mount's, or fail with EIO.
 */
export interface LazyVmBlobs {
  /** Marks the blob (before QEMU opens it: only files opened while marked raise events). */
  hold(digest: string): Promise<void>;
  /** After QEMU is gone. */
  release(digest: string): Promise<void>;
  /** Whether a blob a VM of a previous worker opened is still guarded (the gate kept it, or it is complete). */
  canAdopt(digest: string): Promise<boolean>;
}

/** Per VM, the lazy layers it holds: held before QEMU starts, released once QEMU is gone. */
export class VmLazyHolds {
  private readonly held = new Map<string, string[]>();

  constructor(private readonly lazy: LazyVmBlobs | undefined) {}

  async hold(sandboxId: string, digests: readonly string[]): Promise<void> {
    if (digests.length === 0 || this.held.has(sandboxId)) return;
    const lazy = this.lazy;
    if (!lazy) throw new RollboxError('internal', `sandbox ${sandboxId} has lazy layers and this host reads none`);
    const done: string[] = [];
    this.held.set(sandboxId, done);
    for (const digest of new Set(digests)) {
      await lazy.hold(digest);
      done.push(digest);
    }
  }

  async release(sandboxId: string): Promise<void> {
    const digests = this.held.get(sandboxId) ?? [];
    this.held.delete(sandboxId);
    for (const digest of digests) await this.lazy?.release(digest).catch(() => undefined);
  }

  /**
   * A VM a previous worker started: adoptable only if every lazy blob it reads is still
   * guarded (a gate that died with its keeper let its reads of holes through as zeros).
   */
  async adopt(sandboxId: string, digests: readonly string[]): Promise<boolean> {
    if (digests.length === 0) return true;
    for (const digest of digests) if (!this.lazy || !(await this.lazy.canAdopt(digest))) return false;
    await this.hold(sandboxId, digests);
    return true;
  }
}

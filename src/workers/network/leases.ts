import { mkdir, readFile, readdir, unlink, writeFile } from 'node:fs/promises';
import path from 'node:path';

/**
 * Claims one of `slots` numbered files in a host-wide directory with an exclusive create
 * (several workers of one host share it), trying from `start` on. Returns the index, or
 * undefined when every slot is taken.
 */
export async function claimLeaseFile(dir: string, name: (index: number) => string, slots: number, start: number, content: string): Promise<number | undefined> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  for (let i = 0; i < slots; i++) {
    const index = (start + i) % slots;
    try {
      await writeFile(path.join(dir, name(index)), content, { flag: 'wx' });
      return index;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  }
  return undefined;
}

/**
 * The veth-pool leases of one worker: a file per /30 (its index) holding `<nodeId>
 * <sandboxId>`, so a restarted worker finds its sandboxes' addresses again.
 */
export class AddressLeases {
  /** This worker's leases (sandbox id -> slot index), read from the directory once. */
  private index: Promise<Map<string, number>> | undefined;

  constructor(
    private readonly dir: string,
    private readonly nodeId: string,
  ) {}

  all(): Promise<Map<string, number>> {
    this.index ??= (async () => {
      const out = new Map<string, number>();
      for (const name of await readdir(this.dir).catch(() => [] as string[])) {
        if (!/^\d+$/.test(name)) continue;
        const text = await readFile(path.join(this.dir, name), 'utf8').catch(() => '');
        const [nodeId, sandboxId] = text.trim().split(' ');
        if (nodeId === this.nodeId && sandboxId) out.set(sandboxId, Number(name));
      }
      return out;
    })();
    return this.index;
  }

  /** The sandbox's slot index: its existing lease, or a free one (undefined: the pool is full). */
  async claim(sandboxId: string, slots: number): Promise<number | undefined> {
    const leases = await this.all();
    const existing = leases.get(sandboxId);
    if (existing !== undefined) return existing;
    const index = await claimLeaseFile(this.dir, String, slots, Math.floor(Math.random() * slots), `${this.nodeId} ${sandboxId}\n`);
    if (index !== undefined) leases.set(sandboxId, index);
    return index;
  }

  async release(sandboxId: string, index: number): Promise<void> {
    await unlink(path.join(this.dir, String(index))).catch(() => undefined);
    (await this.all()).delete(sandboxId);
  }
}

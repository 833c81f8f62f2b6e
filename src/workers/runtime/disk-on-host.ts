import { readFileSync, writeFileSync } from 'node:fs';
import type { RuntimeContext } from './context.ts';

/**
 * A running sandbox's disk is not mounted on the host (see ScratchDisks.releaseFromHost):
 * its filesystem lives on in the sandbox's overlay, reached again through its loop device
 * when the host needs the upper dir. The device is kept in the bundle, for a worker that
 * adopts the sandbox after a restart.
 */
export function recordDiskDevice(ctx: RuntimeContext, id: string, device: string): void {
  writeFileSync(ctx.layout.diskDeviceFileOf(id), device);
}

function diskDeviceOf(ctx: RuntimeContext, id: string): string | undefined {
  try {
    return readFileSync(ctx.layout.diskDeviceFileOf(id), 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}

/** Mounts the sandbox's disk on the host again; false if it was mounted already or is gone with its container. */
export async function mountDiskOnHost(ctx: RuntimeContext, id: string): Promise<boolean> {
  const device = diskDeviceOf(ctx, id);
  return device ? ctx.scratch.mountOnHost(id, device, ctx.layout.diskOf(id)) : false;
}

/** `fn` with the sandbox's disk mounted on the host (its upper dir readable there), then let go again. */
export async function withDiskOnHost<T>(ctx: RuntimeContext, id: string, fn: () => Promise<T>): Promise<T> {
  const mounted = await mountDiskOnHost(ctx, id);
  try {
    return await fn();
  } finally {
    if (mounted) await ctx.scratch.releaseFromHost(ctx.layout.diskOf(id));
  }
}

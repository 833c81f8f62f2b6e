import fs from 'node:fs/promises';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { runToolOk } from '../../proc/index.ts';
import { copySparse, IMAGE_FILES } from './hibernation.ts';
import { migrationEnded, qmpCommand, withQmp } from './qmp.ts';

/** The device state is a few hundred KiB; the save's QMP session is bounded. */
const MIGRATION_TIMEOUT_MS = 60_000;

const IGNORE_SHARED_RAM = { capabilities: [{ capability: 'x-ignore-shared', state: true }] };

const shellQuoted = (p: string): string => `'${p.replaceAll("'", `'\\''`)}'`;

export interface ForkSave {
  qmpSocket: string;
  ramFile: string;
  diskImage: string;
  startedWith: unknown;
  /** A tmpfs directory of this host (the RAM files' own): the RAM is copied here while the VM is stopped. */
  stagingDir: string;
}

/**
 * A fork's image of a running or paused VM, in the format of a hibernation's (hibernation.ts:
 * `ram`, `devices`, `disk.ext4`, `vm.json`), written into `imageDir` (whole or absent), the
 * VM running on after. Every child restores it, each with its own RAM and disk copied out.
 *
 * The VM is stopped (QMP `stop`: QEMU flushes its disks) only while its device state is
 * streamed out (x-ignore-shared: about 70 KiB), its RAM file is copied to a tmpfs beside it
 * (memory to memory, the fastest copy this host has: ~1 GB/s) and its disk is copied (a
 * reflink where the VM's directory and the layer store share a filesystem that has them)
 * into the image, the three at once; then it runs on
 * (`cont`), and the RAM copy goes into the layer store while it runs. A paused VM stays
 * stopped (frozenMs 0). Why a copy while stopped and not QEMU's pre-copy migration (17-24 ms
 * stopped): docs/microvm.md, "Forks keep processes".
 */
export async function saveForkImage(vm: ForkSave, imageDir: string): Promise<{ frozenMs: number }> {
  const partial = `${imageDir}.part-${process.pid}`;
  const stagedRam = path.join(vm.stagingDir, `${path.basename(imageDir)}.ram`);
  await fs.rm(partial, { recursive: true, force: true });
  await fs.mkdir(partial, { recursive: true, mode: 0o700 });
  await fs.mkdir(vm.stagingDir, { recursive: true, mode: 0o700 });
  let wasRunning = false;
  let stoppedAt: number | undefined;
  let resumed = false;
  let frozenMs = 0;
  try {
    await withQmp(
      vm.qmpSocket,
      async (qmp) => {
        wasRunning = ((await qmp.command('query-status')) as { running?: boolean }).running === true;
        await qmp.command('migrate-set-capabilities', IGNORE_SHARED_RAM);
        if (wasRunning) {
          await qmp.command('stop');
          stoppedAt = performance.now();
        }
        try {
          // The three at once (separate processes: this host's two cores copy side by side).
          const devices = qmp.command('migrate', { uri: `exec:cat > ${shellQuoted(path.join(partial, IMAGE_FILES.devices))}` }).then(() => migrationEnded(qmp));
          const copies = Promise.all([copySparse(vm.ramFile, stagedRam), runToolOk('cp', ['--reflink=auto', '--sparse=always', vm.diskImage, path.join(partial, IMAGE_FILES.disk)])]);
          const settled = await Promise.allSettled([devices, copies]);
          for (const r of settled) if (r.status === 'rejected') throw r.reason;
        } finally {
          if (wasRunning) {
            await qmp.command('cont');
            resumed = true;
            frozenMs = performance.now() - stoppedAt!;
          } else {
            // A migration leaves a stopped VM "postmigrate", which QEMU will not migrate again (a
            // second fork, a hibernation): run for a moment and stopped again, it is plainly paused.
            // Its sandbox stays frozen in the guest (pauseVm), so none of its processes runs.
            await qmp.command('cont');
            await qmp.command('stop');
          }
        }
      },
      MIGRATION_TIMEOUT_MS,
    );
    await copySparse(stagedRam, path.join(partial, IMAGE_FILES.ram));
    await fs.writeFile(path.join(partial, IMAGE_FILES.vm), JSON.stringify(vm.startedWith));
    await fs.rm(imageDir, { recursive: true, force: true });
    await fs.rename(partial, imageDir);
    return { frozenMs };
  } catch (err) {
    await fs.rm(partial, { recursive: true, force: true });
    // The session broke while the VM was stopped: it runs on all the same.
    if (wasRunning && !resumed) await qmpCommand(vm.qmpSocket, 'cont').catch(() => undefined);
    throw err;
  } finally {
    await fs.rm(stagedRam, { force: true });
  }
}

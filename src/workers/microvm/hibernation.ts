import fs from 'node:fs/promises';
import path from 'node:path';
import { runToolOk } from '../../proc/index.ts';
import { migrationEnded, qmpCommand, withQmp } from './qmp.ts';

/**
 * A hibernated microVM on disk, one directory (in the shared layer store, so another host
 * can wake it):
 *   - `ram`: the guest's RAM file as it was (sparse: pages the guest never touched are holes);
 *   - `devices`: QEMU's migration stream with the RAM left out (x-ignore-shared: the RAM is
 *     a shared memory-backend-file), i.e. the vCPUs' and devices' state;
 *   - `disk.ext4`: the sandbox's writable disk (sparse);
 *   - `vm.json`: how QEMU was started (the restore must start it with the same devices).
 */
export const IMAGE_FILES = { ram: 'ram', devices: 'devices', disk: 'disk.ext4', vm: 'vm.json' } as const;

/** The device state is a few hundred KiB; the whole save or load, QMP included, is bounded. */
const MIGRATION_TIMEOUT_MS = 60_000;

const IGNORE_SHARED_RAM = { capabilities: [{ capability: 'x-ignore-shared', state: true }] };

/** A file copied with its holes kept (GNU cp seeks over them): a sparse RAM file or disk costs what it holds. */
export async function copySparse(from: string, to: string): Promise<void> {
  await runToolOk('cp', ['--sparse=always', from, to]);
}

const shellQuoted = (p: string): string => `'${p.replaceAll("'", `'\\''`)}'`;

/**
 * Saves a VM into `imageDir` and leaves it stopped: its vCPUs stopped (QEMU flushes its
 * disks on stop), the devices' state streamed out, the RAM and disk files copied. Written
 * into a sibling directory first and renamed into place, so `imageDir` is either whole or
 * absent. On failure the VM runs on as it was.
 */
export async function saveVm(vm: { qmpSocket: string; ramFile: string; diskImage: string; startedWith: unknown }, imageDir: string): Promise<void> {
  const partial = `${imageDir}.part-${process.pid}`;
  await fs.rm(partial, { recursive: true, force: true });
  await fs.mkdir(partial, { recursive: true, mode: 0o700 });
  let wasRunning = false;
  try {
    await withQmp(
      vm.qmpSocket,
      async (qmp) => {
        wasRunning = ((await qmp.command('query-status')) as { running?: boolean }).running === true;
        await qmp.command('migrate-set-capabilities', IGNORE_SHARED_RAM);
        await qmp.command('stop');
        await qmp.command('migrate', { uri: `exec:cat > ${shellQuoted(path.join(partial, IMAGE_FILES.devices))}` });
        await migrationEnded(qmp);
      },
      MIGRATION_TIMEOUT_MS,
    );
    await copySparse(vm.ramFile, path.join(partial, IMAGE_FILES.ram));
    await copySparse(vm.diskImage, path.join(partial, IMAGE_FILES.disk));
    await fs.writeFile(path.join(partial, IMAGE_FILES.vm), JSON.stringify(vm.startedWith));
    await fs.rm(imageDir, { recursive: true, force: true });
    await fs.rename(partial, imageDir);
  } catch (err) {
    await fs.rm(partial, { recursive: true, force: true });
    if (wasRunning) await qmpCommand(vm.qmpSocket, 'cont').catch(() => undefined);
    throw err;
  }
}

/** What a restore starts QEMU with, from the image: its RAM and disk copied where the new VM keeps them. */
export async function readImage<T>(imageDir: string, to: { ramFile: string; diskImage: string }): Promise<T> {
  const startedWith = JSON.parse(await fs.readFile(path.join(imageDir, IMAGE_FILES.vm), 'utf8')) as T;
  await fs.mkdir(path.dirname(to.ramFile), { recursive: true, mode: 0o700 });
  await copySparse(path.join(imageDir, IMAGE_FILES.ram), to.ramFile);
  await copySparse(path.join(imageDir, IMAGE_FILES.disk), to.diskImage);
  return startedWith;
}

/** Loads the saved device state into a QEMU started with `incoming` (paused, `-incoming defer`) and lets the vCPUs run. */
export async function loadVm(qmpSocket: string, imageDir: string): Promise<void> {
  await withQmp(
    qmpSocket,
    async (qmp) => {
      await qmp.command('migrate-set-capabilities', IGNORE_SHARED_RAM);
      await qmp.command('migrate-incoming', { uri: `exec:cat ${shellQuoted(path.join(imageDir, IMAGE_FILES.devices))}` });
      await migrationEnded(qmp);
      await qmp.command('cont');
    },
    MIGRATION_TIMEOUT_MS,
  );
}

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';

/** Host-level traces of a data dir: what must be gone after sandboxes are released. */
export function hostTraces(dir: string): { mounts: string[]; loops: string[]; containers: string[] } {
  const mounts = fs
    .readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .filter((line) => line.includes(dir));
  const loops = execFileSync('losetup', ['-a'], { encoding: 'utf8' })
    .split('\n')
    .filter((line) => line.includes(dir));
  const runcRoots = fs.existsSync(dir) ? findRuncRoots(dir) : [];
  const containers = runcRoots.flatMap((root) =>
    execFileSync('runc', ['--root', root, 'list', '-q'], { encoding: 'utf8' })
      .split('\n')
      .filter(Boolean),
  );
  return { mounts, loops, containers };
}

/** runc state roots of the worker data dir `dir`, or of the worker data dirs inside it. */
function findRuncRoots(dir: string): string[] {
  const candidates = [`${dir}/worker/runc`];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) if (entry.isDirectory()) candidates.push(`${dir}/${entry.name}/worker/runc`);
  return candidates.filter((candidate) => fs.existsSync(candidate));
}

/** rollbox-gate processes (lazy layers' gates and keepers) serving a data dir under `dir`. */
export function gatesUnder(dir: string): number[] {
  return fs.readdirSync('/proc').flatMap((p) => {
    if (!/^\d+$/.test(p)) return [];
    let argv: string[];
    try {
      argv = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
    } catch {
      return []; // exited meanwhile
    }
    return argv[0]?.endsWith('rollbox-gate') && argv.some((a) => a.startsWith(dir)) ? [Number(p)] : [];
  });
}

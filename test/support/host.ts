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

function findRuncRoots(dir: string): string[] {
  const roots: string[] = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (!entry.isDirectory()) continue;
    const candidate = `${dir}/${entry.name}/worker/runc`;
    if (fs.existsSync(candidate)) roots.push(candidate);
  }
  return roots;
}

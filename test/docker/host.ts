import { execFile, spawn, type ChildProcess } from 'node:child_process';
import type { Readable } from 'node:stream';
import { existsSync, openSync, closeSync } from 'node:fs';
import { readFile, readdir } from 'node:fs/promises';
import { promisify } from 'node:util';
import { HostFirewall } from '../../src/workers/network/host-firewall.ts';

const execFileAsync = promisify(execFile);
/** Debian's docker.io client (a newer one elsewhere on PATH may not match its 20.10 engine). */
export const DOCKER = '/usr/bin/docker';
export const COMPOSE = '/usr/bin/docker-compose';

const startedAtMs = Date.now();
/** Progress on stdout, with the time since the run began. */
export function progress(message: string): void {
  console.log(`[docker test ${((Date.now() - startedAtMs) / 1000).toFixed(1)}s] ${message}`);
}

export async function run(cmd: string, args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; input?: string } = {}): Promise<string> {
  try {
    const child = execFileAsync(cmd, args, { env: options.env ?? process.env, cwd: options.cwd, maxBuffer: 64 << 20, encoding: 'utf8' });
    if (options.input !== undefined) {
      child.child.stdin!.end(options.input);
    }
    return (await child).stdout;
  } catch (err) {
    const e = err as Error & { stdout?: string; stderr?: string };
    throw new Error(`${cmd} ${args.join(' ')} failed: ${e.message}\n${(e.stderr ?? '').slice(-4000)}`, { cause: err });
  }
}

/** What a deployment could leave on the host: compared before and after. */
export interface HostState {
  iptables: string;
  ip6tables: string;
  links: string[];
  netns: string[];
  /** Mounts whose source or target is Docker's or a worker's. */
  mounts: string[];
  /** Loop devices and their backing files. */
  loops: string[];
  /** rollbox/<node> cgroups, per controller. */
  cgroups: string[];
}

const rulesOf = (text: string) => text.split('\n').filter((l) => l && !l.startsWith('#')).map((l) => l.replace(/\[\d+:\d+\]/, '[counters]')).join('\n');

const policiesOf = (text: string) => text.split('\n').filter((l) => l.startsWith(':') || l.startsWith('*')).map((l) => l.replace(/\[\d+:\d+\]/, '')).join('\n');

export async function hostState(): Promise<HostState> {
  const links = (await run('ip', ['-o', 'link'])).split('\n').map((l) => /^\d+: ([^:@]+)/.exec(l)?.[1]).filter((l): l is string => Boolean(l));
  const netns = (await run('ip', ['netns', 'list'])).split('\n').map((l) => l.split(' ')[0]!).filter(Boolean);
  const mounts = (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').filter((l) => /\/var\/lib\/docker|\/run\/docker|\/var\/lib\/rollbox/.test(l)).map((l) => l.split(' ').slice(3, 5).join(' '));
  const loops = (await run('losetup', ['-l', '-n', '-O', 'NAME,BACK-FILE'])).split('\n').map((l) => l.trim()).filter(Boolean);
  const cgroups: string[] = [];
  for (const controller of await readdir('/sys/fs/cgroup').catch(() => [])) {
    const dir = `/sys/fs/cgroup/${controller}/rollbox`;
    if (existsSync(dir)) for (const node of await readdir(dir, { withFileTypes: true })) if (node.isDirectory()) cgroups.push(`${controller}/rollbox/${node.name}`);
  }
  return { iptables: rulesOf(await run('iptables-save', [])), ip6tables: rulesOf(await run('ip6tables-save', [])), links, netns, mounts, loops, cgroups };
}

/** Entries of `after` that `before` lacked (what the run left behind). */
export function leftOver(before: HostState, after: HostState, nodeIds: string[]): Record<string, string[]> {
  const added = (a: string[], b: string[]) => b.filter((x) => !a.includes(x));
  return {
    links: added(before.links, after.links),
    netns: added(before.netns, after.netns),
    mounts: added(before.mounts, after.mounts),
    // Other tests on this host attach loop devices meanwhile: only the deployment's count.
    loops: added(before.loops, after.loops).filter((l) => / (\/var\/lib\/docker|\/var\/lib\/rollbox|\/layers)\//.test(l)),
    // Other tests' worker hosts make cgroups meanwhile: only the deployment's workers' count.
    cgroups: added(before.cgroups, after.cgroups).filter((c) => nodeIds.some((id) => c.endsWith(`/rollbox/${id}`))),
  };
}

export interface Dockerd {
  /** Whether this run started it (and so stops it). */
  ours: boolean;
  stop(): Promise<void>;
}

/**
 * A Docker engine: the one running, or one started here. Ours runs without touching the
 * host's firewall (`--iptables=false`, no forwarding or masquerade changes, no docker0):
 * other tests on this host route sandbox traffic through it meanwhile. Builds use the host's
 * network instead. Stopped by its pid; the iptables rules are put back if they changed anyway.
 */
export async function ensureDockerd(logFile: string, iptablesBefore: { v4: string; v6: string }): Promise<Dockerd> {
  if (await run(DOCKER, ['info', '--format', '{{.ServerVersion}}']).then(() => true, () => false)) {
    progress('using the Docker engine already running');
    return { ours: false, stop: async () => {} };
  }
  const mountsBefore = await readFile('/proc/self/mountinfo', 'utf8');
  const log = openSync(logFile, 'a');
  const child: ChildProcess = spawn('dockerd', ['--iptables=false', '--ip6tables=false', '--ip-forward=false', '--ip-masq=false', '--bridge=none'], { stdio: ['ignore', log, log], detached: false });
  closeSync(log);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  progress(`started dockerd (pid ${child.pid}), log ${logFile}`);
  const deadline = Date.now() + 60_000;
  while (!(await run(DOCKER, ['info', '--format', '{{.ServerVersion}}']).then(() => true, () => false))) {
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`dockerd did not come up (see ${logFile})`);
    await new Promise((r) => setTimeout(r, 300));
  }
  return {
    ours: true,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        await Promise.race([exited, new Promise((r) => setTimeout(r, 30_000))]);
        if (child.exitCode === null && child.signalCode === null) {
          child.kill('SIGKILL');
          await exited;
        }
      }
      progress(`dockerd (pid ${child.pid}) stopped`);
      // dockerd leaves the bind mount of the host's netns it made at start.
      const leftMount = '/run/docker/netns/default';
      if (!mountsBefore.includes(leftMount) && (await readFile('/proc/self/mountinfo', 'utf8')).includes(` ${leftMount} `)) await run('umount', [leftMount]);
      // Put back only what Docker changed (its chains, a policy): other tests' rules added
      // meanwhile would go with a blind restore.
      const byDocker = (now: string, saved: string) => (/DOCKER/.test(now) && !/DOCKER/.test(saved)) || policiesOf(now) !== policiesOf(saved);
      for (const [save, restore, saved] of [['iptables-save', 'iptables-restore', iptablesBefore.v4], ['ip6tables-save', 'ip6tables-restore', iptablesBefore.v6]] as const) {
        if (!byDocker(await run(save, []), saved)) continue;
        progress(`${save}: Docker changed the host's rules while it ran; restoring the saved rules and policies`);
        await run(restore, [], { input: saved });
      }
    },
  };
}

/**
 * The host forwards between the deployment's bridge and the test's target namespace while
 * the test runs. ip_forward is host-wide and shared with rollbox workers of other tests on
 * this host, so it goes by their rule: the original value is kept in the lease dir, and a
 * table `inet rollbox-*` stands for this holder until it is done; the last holder restores it.
 */
export async function holdForwarding(): Promise<() => Promise<void>> {
  const holder = `dockertest${process.pid}`;
  await run('nft', ['add', 'table', 'inet', `rollbox-${holder}`]);
  const firewall = new HostFirewall({ nodeId: holder, poolCidr: '10.200.0.0/16', stateDir: '/run/rollbox/net' });
  await firewall.enableForwarding();
  return async () => {
    await run('nft', ['delete', 'table', 'inet', `rollbox-${holder}`]);
    await firewall.restoreForwarding();
  };
}

/** `docker import` of a root filesystem tar (a stream or its bytes) as `tag`, with Dockerfile lines as `--change`s; answers its exit code. */
export async function dockerImport(tag: string, tar: Readable | Buffer, changes: string[] = []): Promise<number | null> {
  const importing = spawn(DOCKER, ['import', ...changes.flatMap((c) => ['--change', c]), '-', tag], { stdio: ['pipe', 'ignore', 'inherit'] });
  if (Buffer.isBuffer(tar)) importing.stdin.end(tar);
  else tar.pipe(importing.stdin);
  return new Promise((resolve) => importing.once('close', resolve));
}

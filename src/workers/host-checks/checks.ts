import { execFile } from 'node:child_process';
import { constants, existsSync } from 'node:fs';
import { access, mkdir, open, readFile, rmdir } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { DEFAULT_CAPABILITIES } from '../runtime/index.ts';
import { discoverCgroups } from '../runtime/cgroups.ts';
import { capabilitiesIn } from './capabilities.ts';

const run = promisify(execFile);

/**
 * What a worker host needs of the machine (or container) it runs on, checked at start so an
 * operator reads each missing piece by name instead of a runc error on the first create.
 * Found by trying in a Docker container (wrangler-free-docker/README.md lists them).
 */
export interface MissingRequirement {
  /** What is missing, as an operator grants it: `CAP_NET_ADMIN`, `/dev/loop-control`, ... */
  name: string;
  /** What breaks without it. */
  breaks: string;
  /** How to provide it. */
  fix: string;
  /** Without it no sandbox at all can run (else only some features fail). */
  fatal: boolean;
}

/**
 * The worker's own needs beyond what every sandbox is given (found by taking each away in
 * a container, scripts/docker-find-privileges.sh): mounts, namespaces and pivot_root
 * (SYS_ADMIN); its nftables table and veths, which its start sets up (NET_ADMIN). MKNOD,
 * for loop device nodes, is in the sandboxes' set already.
 */
export const WORKER_OWN_CAPABILITIES = ['CAP_SYS_ADMIN', 'CAP_NET_ADMIN'] as const;
/**
 * Needed for allowlist networks only: the worker joins a sandbox's network namespace to
 * give it its veth, and the sandbox's init is not dumpable, so opening its
 * /proc/<pid>/ns/net takes SYS_PTRACE.
 */
export const NETWORK_CAPABILITIES = ['CAP_SYS_PTRACE'] as const;

/** Loop device nodes made when a container's own /dev has none (loop devices are numbered host-wide). */
const LOOP_NODES = 256;
const PROBE_SYSCTL = '/proc/sys/net/ipv4/ip_forward';

export interface HostCheckOptions {
  /** Text of /proc/self/status (tests pass their own). */
  statusText?: string;
  /** Whether a missing piece that every sandbox needs ends the start (default true). */
  fatal?: boolean;
}

export async function checkWorkerHost(options: HostCheckOptions = {}): Promise<MissingRequirement[]> {
  const missing: MissingRequirement[] = [];
  missing.push(...checkCapabilities(options.statusText ?? (await readFile('/proc/self/status', 'utf8'))));
  missing.push(...(await checkLoopDevices()));
  missing.push(...(await checkCgroups()));
  missing.push(...(await checkSysctls()));
  missing.push(...(await checkKeyring()));
  return missing;
}

export function checkCapabilities(statusText: string): MissingRequirement[] {
  const effective = capabilitiesIn(statusText, 'CapEff');
  const bounding = capabilitiesIn(statusText, 'CapBnd');
  const have = (cap: string) => effective.has(cap) && bounding.has(cap);
  const missing: MissingRequirement[] = [];
  for (const cap of DEFAULT_CAPABILITIES) {
    if (!have(cap)) missing.push({ name: cap, breaks: 'every sandbox (sandboxes get it, so the worker must hold it)', fix: `cap_add: ${cap.slice(4)}`, fatal: true });
  }
  for (const cap of WORKER_OWN_CAPABILITIES) {
    if (!have(cap)) missing.push({ name: cap, breaks: cap === 'CAP_NET_ADMIN' ? 'the worker\'s start (its nftables table, sandbox networks)' : 'every sandbox (the worker mounts layers and root filesystems)', fix: `cap_add: ${cap.slice(4)}`, fatal: true });
  }
  for (const cap of NETWORK_CAPABILITIES) {
    if (!have(cap)) missing.push({ name: cap, breaks: 'allowlist networks (joining a sandbox\'s network namespace: its init is not dumpable)', fix: `cap_add: ${cap.slice(4)}`, fatal: false });
  }
  return missing;
}

/**
 * Loop devices (single-image layers, scratch disks): /dev/loop-control, and the nodes of
 * loop devices. A container's /dev has none of them: the nodes are made here (mknod needs a
 * device cgroup rule for block 7:*) and the kernel creates a loop device on first open.
 */
async function checkLoopDevices(): Promise<MissingRequirement[]> {
  const rule = 'device_cgroup_rules: "b 7:* rmw" (loop devices)';
  const control = await openable('/dev/loop-control', constants.O_RDWR);
  if (control !== 'ok') return [{ name: '/dev/loop-control', breaks: 'every sandbox (layers and scratch disks are loop-mounted)', fix: `devices: /dev/loop-control (${control})`, fatal: true }];
  if (!existsSync('/dev/loop0')) {
    const script = `i=0; while [ $i -lt ${LOOP_NODES} ]; do [ -e /dev/loop$i ] || mknod -m 0660 /dev/loop$i b 7 $i || exit 1; i=$((i+1)); done`;
    const made = await run('sh', ['-c', script]).then(() => 'ok', (err: Error & { stderr?: string }) => (err.stderr ?? err.message).trim());
    if (made !== 'ok') return [{ name: '/dev/loop*', breaks: 'every sandbox (layers and scratch disks are loop-mounted)', fix: `${rule} and CAP_MKNOD, or bind the host's /dev (${made})`, fatal: true }];
  }
  const loop = await openable('/dev/loop0', constants.O_RDONLY);
  if (loop !== 'ok') return [{ name: '/dev/loop*', breaks: 'every sandbox (layers and scratch disks are loop-mounted)', fix: `${rule} (${loop})`, fatal: true }];
  return [];
}

/** The cgroup v1 controllers rollbox limits sandboxes with, mounted from the host's root and writable. */
async function checkCgroups(): Promise<MissingRequirement[]> {
  const fix = 'bind the host\'s cgroup tree read-write: volumes: /sys/fs/cgroup:/sys/fs/cgroup';
  let dirs: string[];
  try {
    const cg = await discoverCgroups();
    dirs = [cg.memory, cg.pids, cg.freezer, ...(cg.cpu ? [cg.cpu] : [])];
  } catch (err) {
    return [{ name: 'cgroup tree', breaks: 'every sandbox', fix: `${fix} (${(err as Error).message})`, fatal: true }];
  }
  const missing: MissingRequirement[] = [];
  for (const dir of new Set(dirs)) {
    const probe = path.join(dir, `rollbox-start-check-${process.pid}`);
    const outcome = await mkdir(probe).then(() => rmdir(probe)).then(() => 'ok', (err: NodeJS.ErrnoException) => err.code ?? err.message);
    if (outcome !== 'ok') missing.push({ name: `cgroup ${path.basename(dir)} (write)`, breaks: 'every sandbox', fix: `${fix} (${outcome})`, fatal: true });
  }
  return missing;
}

/**
 * /proc/sys/net written by the network (ip_forward, IPv6 off in sandboxes' namespaces). A
 * container's /proc/sys is read-only: with CAP_SYS_ADMIN the worker makes /proc/sys/net
 * alone writable (a bind mount of it, remounted read-write). Network sysctls belong to the
 * network namespace that writes them, so this reaches no other container's or the host's.
 */
async function checkSysctls(): Promise<MissingRequirement[]> {
  let outcome = await openable(PROBE_SYSCTL, constants.O_WRONLY);
  if (outcome === 'EROFS') {
    const script = 'mount --bind /proc/sys/net /proc/sys/net && mount -o remount,bind,rw /proc/sys/net';
    outcome = await run('sh', ['-c', script]).then(() => openable(PROBE_SYSCTL, constants.O_WRONLY), (err: Error & { stderr?: string }) => `EROFS, and making /proc/sys/net writable failed: ${(err.stderr ?? err.message).trim()}`);
  }
  if (outcome === 'ok') return [];
  return [{ name: '/proc/sys/net (write)', breaks: 'allowlist networks (ip_forward, IPv6 off in each sandbox\'s namespace)', fix: `CAP_SYS_ADMIN (the worker then makes /proc/sys/net writable), or privileged (${outcome})`, fatal: false }];
}

/** keyctl(2) on this architecture (runc gives each container a session keyring of its own). */
const KEYCTL_SYSCALL: Partial<Record<string, number>> = { x64: 250, arm64: 219 };

/**
 * runc joins a new session keyring for every container (keyctl JOIN_SESSION_KEYRING);
 * Docker's default seccomp profile refuses keyctl. Probed in a short-lived child, whose
 * keyring goes with it.
 */
async function checkKeyring(): Promise<MissingRequirement[]> {
  const nr = KEYCTL_SYSCALL[process.arch];
  if (nr === undefined) return [];
  const outcome = await run('perl', ['-e', `syscall(${nr}, 1, 0) >= 0 or die "$!\n"`]).then(() => 'ok', (err: Error & { stderr?: string }) => (err.stderr ?? err.message).trim());
  if (outcome === 'ok') return [];
  return [{ name: 'keyctl (seccomp)', breaks: 'every sandbox (runc gives each its own session keyring)', fix: `security_opt: seccomp=unconfined, or a profile allowing keyctl (${outcome})`, fatal: true }];
}

async function openable(file: string, flags: number): Promise<string> {
  try {
    await access(file);
    const handle = await open(file, flags);
    await handle.close();
    return 'ok';
  } catch (err) {
    return (err as NodeJS.ErrnoException).code ?? (err as Error).message;
  }
}

interface CheckLogger {
  error(fields: object, message: string): void;
  warn(fields: object, message: string): void;
}

/**
 * The worker's start checks: each missing piece is logged by name with how to grant it;
 * one that no sandbox can run without ends the start (an error naming them all).
 */
export async function checkWorkerHostOrThrow(logger: CheckLogger, options: HostCheckOptions = {}): Promise<MissingRequirement[]> {
  const missing = await checkWorkerHost(options);
  for (const m of missing) logger[m.fatal ? 'error' : 'warn']({ missing: m.name, breaks: m.breaks, fix: m.fix }, `worker host start check: ${m.name} is missing`);
  const fatal = missing.filter((m) => m.fatal);
  if (fatal.length && options.fatal !== false) throw new Error(`this worker host lacks what every sandbox needs: ${fatal.map((m) => `${m.name} (${m.fix})`).join('; ')}`);
  return missing;
}

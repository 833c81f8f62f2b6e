import type { Resources, SandboxClass } from '../../api/index.ts';

/** Where the host's static busybox appears inside every container (the init runs from it). */
export const INIT_BUSYBOX = '/.rollbox/busybox';

/**
 * The container's PID 1: a busybox shell that sleeps in `wait`. It needs nothing from the
 * image (busybox is bind-mounted from the host) and, blocked in `wait`, reaps every child,
 * including orphans re-parented to it when an exec's backgrounded processes outlive it.
 */
export const INIT_ARGS = [INIT_BUSYBOX, 'sh', '-c', `while :; do ${INIT_BUSYBOX} sleep 2147483647 & wait; done`];

const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Docker's default capability set. */
export const DEFAULT_CAPABILITIES = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FSETID',
  'CAP_FOWNER',
  'CAP_MKNOD',
  'CAP_NET_RAW',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETFCAP',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
  'CAP_SYS_CHROOT',
  'CAP_KILL',
  'CAP_AUDIT_WRITE',
] as const;

/** runc's default spec (`runc spec`, runc 1.1). */
export const MASKED_PATHS = [
  '/proc/acpi',
  '/proc/asound',
  '/proc/kcore',
  '/proc/keys',
  '/proc/latency_stats',
  '/proc/timer_list',
  '/proc/timer_stats',
  '/proc/sched_debug',
  '/sys/firmware',
  '/proc/scsi',
] as const;
export const READONLY_PATHS = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'] as const;

const CPU_PERIOD_US = 100_000;
const MIB = 1024 * 1024;

export interface ContainerConfigInput {
  hostname: string;
  env: Record<string, string>;
  workdir: string;
  resources: Resources;
  class: SandboxClass;
  hiddenPaths: readonly string[];
  /** Absolute cgroup path (v1: the same relative path under every controller). */
  cgroupsPath: string;
  /** Host path of the static busybox bound at INIT_BUSYBOX. */
  busyboxPath: string;
  annotations: Record<string, string>;
}

export function envList(env: Record<string, string>): string[] {
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

/** CPU weight: besteffort sandboxes yield to latency ones (cgroup v1 has no cpu.idle). */
export function cpuShares(resources: Resources, cls: SandboxClass): number {
  if (cls === 'besteffort') return 2;
  return Math.max(2, Math.min(262_144, Math.round((resources.cpuMillis * 1024) / 1000)));
}

/** The OCI runtime config (config.json) of one sandbox. Generated here, never by `runc spec`. */
export function containerConfig(input: ContainerConfigInput): object {
  const memoryBytes = input.resources.memoryMiB * MIB;
  const caps = [...DEFAULT_CAPABILITIES];
  return {
    ociVersion: '1.0.2-dev',
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      args: INIT_ARGS,
      env: envList({ PATH: DEFAULT_PATH, HOME: '/root', ...input.env }),
      // runc creates the init's cwd inside the container (safely, after pivot_root), so
      // the workdir exists for every exec without us touching the rootfs from the host.
      cwd: input.workdir,
      capabilities: { bounding: caps, effective: caps, permitted: caps, inheritable: [], ambient: [] },
      // No rlimits: raising any above the worker's needs CAP_SYS_RESOURCE, which this
      // host withholds; processes inherit the worker's limits.
      noNewPrivileges: true,
      // Explicit 0 so processes never inherit the worker's own oom_score_adj; the init is
      // lowered separately after start (see runtime.ts).
      oomScoreAdj: 0,
    },
    root: { path: 'rootfs', readonly: false },
    hostname: input.hostname,
    mounts: [
      { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
      { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'] },
      { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] },
      { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
      { destination: INIT_BUSYBOX, type: 'bind', source: input.busyboxPath, options: ['bind', 'ro', 'nosuid', 'nodev'] },
    ],
    annotations: input.annotations,
    linux: {
      cgroupsPath: input.cgroupsPath,
      resources: {
        devices: [{ allow: false, access: 'rwm' }],
        // swap == limit: no swap beyond the memory limit.
        memory: { limit: memoryBytes, swap: memoryBytes },
        cpu: { shares: cpuShares(input.resources, input.class), quota: input.resources.cpuMillis * (CPU_PERIOD_US / 1000), period: CPU_PERIOD_US },
        pids: { limit: input.resources.pids },
      },
      namespaces: [{ type: 'pid' }, { type: 'network' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }, { type: 'cgroup' }],
      maskedPaths: [...MASKED_PATHS, ...input.hiddenPaths],
      readonlyPaths: [...READONLY_PATHS],
    },
  };
}

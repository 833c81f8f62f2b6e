import type { Resources, SandboxClass } from '../../api/index.ts';

/**
 * Where the container's PID 1, rollbox-init (src/workers/init), appears inside every
 * container: bound read-only from the host, so it needs nothing from the image.
 */
export const SANDBOX_INIT = '/.rollbox/init';
/** Where the host's static busybox appears inside every container (the files API runs it). */
export const SANDBOX_BUSYBOX = '/.rollbox/busybox';

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

/**
 * A small deny-list on top of the capability set (default: allow). It closes the kernel
 * surfaces container escapes have come through that capabilities alone leave open to
 * root in a container: new user namespaces (which hand out a fresh full capability set),
 * io_uring, the kernel keyring, BPF, perf and userfaultfd; and ptrace (with the process_vm_*
 * calls), which lets one command of an agent read or rewrite another (a grader run in the
 * same sandbox, say) that runs as the same uid. clone3 answers ENOSYS so libc
 * falls back to clone, whose namespace flags can be filtered (clone3's cannot).
 */
const EPERM = 1;
const ENOSYS = 38;
const CLONE_NEWUSER = 0x10000000;
export function seccompProfile(): object {
  const deny = (names: string[], errno = EPERM): object => ({ names, action: 'SCMP_ACT_ERRNO', errnoRet: errno });
  return {
    defaultAction: 'SCMP_ACT_ALLOW',
    architectures: ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32', 'SCMP_ARCH_AARCH64', 'SCMP_ARCH_ARM'],
    syscalls: [
      deny(['unshare', 'setns', 'ptrace', 'process_vm_readv', 'process_vm_writev', 'keyctl', 'add_key', 'request_key', 'bpf', 'perf_event_open', 'userfaultfd', 'io_uring_setup', 'io_uring_enter', 'io_uring_register', 'open_by_handle_at', 'name_to_handle_at', 'kexec_load', 'kexec_file_load', 'init_module', 'finit_module', 'delete_module', 'mount', 'umount2', 'pivot_root', 'fsopen', 'fsmount', 'move_mount', 'open_tree', 'swapon', 'swapoff', 'acct', 'lookup_dcookie', 'quotactl']),
      deny(['clone3'], ENOSYS),
      { names: ['clone'], action: 'SCMP_ACT_ERRNO', errnoRet: EPERM, args: [{ index: 0, value: CLONE_NEWUSER, valueTwo: CLONE_NEWUSER, op: 'SCMP_CMP_MASKED_EQ' }] },
    ],
  };
}

export const CPU_PERIOD_US = 100_000;
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
  /** Host path of rollbox-init, bound at SANDBOX_INIT. */
  initBinaryPath: string;
  /** Host path of the static busybox bound at SANDBOX_BUSYBOX. */
  busyboxPath: string;
  /**
   * The sandbox's root filesystem: an overlay runc mounts over the bundle's empty rootfs/
   * inside the container's own mount namespace (see runtime.ts for why).
   */
  rootfs: { lowerdirs: readonly string[]; upperdir: string; workdir: string };
  /** Whether the host accounts swap (memsw); without it runc cannot set a swap limit. */
  limitSwap: boolean;
  /** Apply seccompProfile() (default true). */
  seccomp?: boolean;
  /** Setuid programs may raise privileges within the sandbox (no no_new_privs). */
  allowPrivilegeEscalation?: boolean;
  /** oom_score_adj given to the init and every exec'd process. */
  oomScoreAdj: number;
  annotations: Record<string, string>;
}

export function envList(env: Record<string, string>): string[] {
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

/** CPU weight: besteffort sandboxes yield to latency ones (runtime.ts also sets their cpu.idle). */
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
      args: [SANDBOX_INIT],
      env: envList({ PATH: DEFAULT_PATH, HOME: '/root', ...input.env }),
      // runc creates the init's cwd inside the container (safely, after pivot_root), so
      // the workdir exists for every exec without us touching the rootfs from the host.
      cwd: input.workdir,
      capabilities: { bounding: caps, effective: caps, permitted: caps, inheritable: [], ambient: [] },
      // No rlimits: raising any above the worker's needs CAP_SYS_RESOURCE, which this
      // host withholds; processes inherit the worker's limits.
      noNewPrivileges: input.allowPrivilegeEscalation !== true,
      // runc applies this to the init (create.ts lowers it to 0 again); the init sets it for
      // every command. Positive so a host OOM takes sandbox processes before the worker.
      oomScoreAdj: input.oomScoreAdj,
    },
    root: { path: 'rootfs', readonly: false },
    hostname: input.hostname,
    mounts: [
      // First: every later mount lands on top of it, and pivot_root enters it.
      {
        destination: '/',
        type: 'overlay',
        source: 'overlay',
        options: [`lowerdir=${input.rootfs.lowerdirs.join(':')}`, `upperdir=${input.rootfs.upperdir}`, `workdir=${input.rootfs.workdir}`],
      },
      { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
      { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'] },
      { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] },
      { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
      { destination: SANDBOX_INIT, type: 'bind', source: input.initBinaryPath, options: ['bind', 'ro', 'nosuid', 'nodev'] },
      { destination: SANDBOX_BUSYBOX, type: 'bind', source: input.busyboxPath, options: ['bind', 'ro', 'nosuid', 'nodev'] },
    ],
    annotations: input.annotations,
    linux: {
      cgroupsPath: input.cgroupsPath,
      resources: {
        devices: [{ allow: false, access: 'rwm' }],
        // swap == limit: no swap beyond the memory limit.
        memory: input.limitSwap ? { limit: memoryBytes, swap: memoryBytes } : { limit: memoryBytes },
        cpu: { shares: cpuShares(input.resources, input.class), quota: input.resources.cpuMillis * (CPU_PERIOD_US / 1000), period: CPU_PERIOD_US },
        pids: { limit: input.resources.pids },
      },
      namespaces: [{ type: 'pid' }, { type: 'network' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }, { type: 'cgroup' }],
      ...(input.seccomp === false ? {} : { seccomp: seccompProfile() }),
      maskedPaths: [...MASKED_PATHS, ...input.hiddenPaths],
      readonlyPaths: [...READONLY_PATHS],
    },
  };
}

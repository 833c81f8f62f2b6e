import { createHash } from 'node:crypto';
import path from 'node:path';
import { RollboxError } from '../../api/index.ts';
import { MAX_SOCKET_PATH_BYTES } from '../init/index.ts';
import type { RuntimeExecSpec, SandboxRuntimeSpec } from './types.ts';

/**
 * Where everything of the runc runtime lives on a worker host, and which names are valid.
 *
 *   <dataDir>/runc/rb-<id>/        runc's state of the container
 *   <dataDir>/sandboxes/<id>/      bundle: config.json, policy.json, disk/ (upper + work), rootfs/
 *   <dataDir>/init/<hash>.sock     the sandbox init's private channel (never mounted into a container)
 *   <dataDir>/fork-points/<id>/    a fork point's disk, mounted read-only while it is packed into a layer
 *   <cgroup>/rollbox/<nodeId>/rb-<id>/s<n>   cgroups (besteffort: rollbox-besteffort/...), exec slots s<n>
 */
export const BESTEFFORT_ROOT = 'rollbox-besteffort';

const SANDBOX_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;
const NODE_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;
const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function isSandboxId(id: string): boolean {
  return SANDBOX_ID_RE.test(id) && !id.includes('..');
}

export function checkSandboxId(id: string): void {
  if (!isSandboxId(id)) throw new RollboxError('invalid_request', `invalid sandbox id ${JSON.stringify(id).slice(0, 140)}`);
}

export class RuntimeLayout {
  readonly dataDir: string;
  readonly runcRoot: string;
  readonly sandboxesDir: string;
  readonly socketsDir: string;
  readonly forkPointMountsDir: string;
  /** Cgroup parent of latency sandboxes (relative to each hierarchy's root). */
  readonly cgroupParent: string;
  /**
   * Besteffort sandboxes live in their own top-level tree whose cpu cgroup has cpu.idle
   * set: next to the host's own tasks (this worker) the whole tree is SCHED_IDLE. Under
   * `rollbox/` it would compete at full weight as part of that parent (cgroup v1 does not
   * pass a child's small weight up), and a latency exec lost ~35% to busy besteffort
   * neighbours (bench:interference).
   */
  readonly besteffortParent: string;

  constructor(dataDir: string, nodeId: string) {
    if (!NODE_ID_RE.test(nodeId)) throw new RollboxError('invalid_request', `invalid node id ${JSON.stringify(nodeId)}`);
    this.dataDir = path.resolve(dataDir);
    // Paths end up inside overlayfs mount options, where ',' ':' and '\' are separators.
    if (/[,:\\\s]/.test(this.dataDir)) throw new RollboxError('invalid_request', `data dir ${this.dataDir} must not contain ',', ':', '\\' or whitespace`);
    this.runcRoot = path.join(this.dataDir, 'runc');
    this.sandboxesDir = path.join(this.dataDir, 'sandboxes');
    this.socketsDir = path.join(this.dataDir, 'init');
    this.forkPointMountsDir = path.join(this.dataDir, 'fork-points');
    if (Buffer.byteLength(this.socketOf('x')) > MAX_SOCKET_PATH_BYTES - 2) {
      throw new RollboxError('invalid_request', `data dir ${this.dataDir} is too long for the sandboxes' unix sockets (at most ~${MAX_SOCKET_PATH_BYTES - 30} bytes)`);
    }
    this.cgroupParent = `rollbox/${nodeId}`;
    this.besteffortParent = `${BESTEFFORT_ROOT}/${nodeId}`;
  }

  get cgroupParents(): string[] {
    return [this.cgroupParent, this.besteffortParent];
  }

  containerIdOf(id: string): string {
    return `rb-${id}`;
  }

  /** The sandbox id of a container name of this runtime, if it is one. */
  sandboxIdOfContainer(name: string): string | undefined {
    if (!name.startsWith('rb-')) return undefined;
    const id = name.slice(3);
    return isSandboxId(id) ? id : undefined;
  }

  bundleOf(id: string): string {
    return path.join(this.sandboxesDir, id);
  }

  /** The sandbox's own filesystem (capped at diskMiB); the overlay's upper/ and work/ are in it. */
  diskOf(id: string): string {
    return path.join(this.bundleOf(id), 'disk');
  }

  /** The loop device of the sandbox's disk (see disk-on-host.ts). */
  diskDeviceFileOf(id: string): string {
    return path.join(this.bundleOf(id), 'disk-device');
  }

  runcStateOf(id: string): string {
    return path.join(this.runcRoot, this.containerIdOf(id), 'state.json');
  }

  /** A hash keeps the path short: sun_path holds 108 bytes, a sandbox id may have 128. */
  socketOf(id: string): string {
    return path.join(this.socketsDir, `${createHash('sha256').update(id).digest('hex').slice(0, 24)}.sock`);
  }

  /** The sandbox's cgroup, the same relative path in every v1 hierarchy. */
  cgroupRelOf(id: string, besteffort: boolean): string {
    return `${besteffort ? this.besteffortParent : this.cgroupParent}/${this.containerIdOf(id)}`;
  }
}

export function validateCreate(spec: SandboxRuntimeSpec): void {
  const bad = (msg: string): never => {
    throw new RollboxError('invalid_request', msg);
  };
  checkSandboxId(spec.sandboxId);
  if (spec.forkPoint !== undefined && !isSandboxId(spec.forkPoint)) bad('invalid fork point');
  if (spec.layerImages.length === 0) bad('a sandbox needs at least a base layer');
  for (const l of spec.layerImages) if (!/^sha256:[0-9a-f]{64}$/.test(l.digest) || !path.isAbsolute(l.imagePath) || (l.blobPath !== undefined && !path.isAbsolute(l.blobPath))) bad(`invalid layer ${l.digest}`);
  const absolute = (p: string): boolean => p.startsWith('/') && !p.includes('\0');
  if (!absolute(spec.workdir)) bad('workdir must be an absolute path');
  if (!spec.hiddenPaths.every(absolute)) bad('hidden paths must be absolute');
  if (!Number.isInteger(spec.resources.diskMiB) || spec.resources.diskMiB < 1) bad('diskMiB must be a positive integer');
  for (const [k, v] of Object.entries(spec.env)) if (!ENV_NAME_RE.test(k) || v.includes('\0')) bad(`invalid env ${JSON.stringify(k).slice(0, 100)}`);
}

export function validateExec(spec: Pick<RuntimeExecSpec, 'argv' | 'env' | 'cwd' | 'timeoutMs' | 'outputCapBytes'>): void {
  const bad = (msg: string): never => {
    throw new RollboxError('invalid_request', msg);
  };
  if (spec.argv.length === 0 || spec.argv[0] === '') bad('argv must name a program');
  if (spec.argv.some((a) => a.includes('\0'))) bad('argv must not contain NUL');
  for (const [k, v] of Object.entries(spec.env)) {
    if (!ENV_NAME_RE.test(k)) bad(`invalid env name ${JSON.stringify(k).slice(0, 100)}`);
    if (v.includes('\0')) bad(`env ${k} contains NUL`);
  }
  if (spec.cwd !== undefined && (!spec.cwd.startsWith('/') || spec.cwd.includes('\0'))) bad('cwd must be an absolute path');
  if (!(spec.timeoutMs > 0) || !(spec.outputCapBytes >= 0)) bad('timeoutMs must be > 0 and outputCapBytes >= 0');
}

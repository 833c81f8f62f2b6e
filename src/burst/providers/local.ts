import { spawn, type ChildProcess } from 'node:child_process';
import { rm } from 'node:fs/promises';
import path from 'node:path';
import type { CloudProvider, ProviderHost, ProvisionRequest } from './types.ts';

export interface LocalProviderOptions {
  /** Each host gets `<baseDir>/<hostId>` as its data dir, with its own layer store inside. */
  baseDir: string;
  /** The `rollbox` entry point (bin/rollbox.js). */
  rollboxBin: string;
  /** Extra environment for the hosts (log level, heartbeat interval, capacity). */
  env: Record<string, string>;
  /** How long a terminated host may take to stop its sandboxes before it is killed. */
  stopTimeoutMs?: number;
}

interface LocalHost {
  child: ChildProcess;
  startedAtMs: number;
  dataDir: string;
}

/**
 * "Cloud" hosts as processes on this machine, for the demo and the tests: each is a
 * `rollbox worker --pool cloud` with its own data dir, node id and layer store, in its
 * own process group. Terminate sends SIGTERM to its pid (it stops its sandboxes), then
 * SIGKILL if it takes too long. A host killed from outside leaves its containers behind,
 * as a crashed worker does; a worker started on its data dir reconciles them away.
 */
export class LocalProvider implements CloudProvider {
  readonly name = 'local';
  private readonly hosts = new Map<string, LocalHost>();

  constructor(private readonly options: LocalProviderOptions) {}

  async provision(request: ProvisionRequest): Promise<{ id: string }> {
    const dataDir = path.join(this.options.baseDir, request.hostId);
    const child = spawn(process.execPath, [this.options.rollboxBin, 'worker', '--pool', request.pool, '--data-dir', dataDir, '--node-id', request.hostId, '--destroy-on-exit'], {
      env: {
        ...process.env,
        ...this.options.env,
        REDIS_URL: request.redisUrl,
        ROLLBOX_GATEWAY_URL: request.gatewayUrl,
        ROLLBOX_GATEWAY_TOKEN: request.token,
        ROLLBOX_SYNC_LAYERS: request.layers.join(','),
        ROLLBOX_LAYER_STORE: path.join(dataDir, 'layers'),
        ROLLBOX_NODE_MAX_SANDBOXES: String(request.slots),
      },
      stdio: ['ignore', 'ignore', 'inherit'],
      detached: true,
    });
    child.unref();
    this.hosts.set(request.hostId, { child, startedAtMs: Date.now(), dataDir });
    child.once('exit', () => {
      // Stopped on purpose (or died): a vanished host is noticed by its missing heartbeat.
      if (this.hosts.get(request.hostId)?.child === child) this.hosts.delete(request.hostId);
    });
    return { id: request.hostId };
  }

  async terminate(id: string): Promise<void> {
    const host = this.hosts.get(id);
    if (!host) return;
    const { child } = host;
    const exited = new Promise<void>((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', () => resolve())));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), this.options.stopTimeoutMs ?? 30_000);
    await exited;
    clearTimeout(timer);
    this.hosts.delete(id);
    // A clean stop unmounted everything; its data dir (own layer store) goes with the "VM".
    if (child.exitCode === 0) await rm(host.dataDir, { recursive: true, force: true });
  }

  async list(): Promise<ProviderHost[]> {
    return [...this.hosts.entries()].map(([id, h]) => ({ id, state: 'running', startedAtMs: h.startedAtMs }));
  }

  /** Process id of a host (tests kill one to simulate a vanished VM). */
  pidOf(id: string): number | undefined {
    return this.hosts.get(id)?.child.pid;
  }

  async close(): Promise<void> {
    await Promise.all([...this.hosts.keys()].map((id) => this.terminate(id)));
  }
}

import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { Redis } from 'ioredis';

export interface RedisServerHandle {
  url: string;
  port: number;
  pid: number;
  /** Stops the server (SIGTERM, then SIGKILL after a grace period). Safe to call twice. */
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const address = srv.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Starts a private redis-server bound to loopback with its data in `dataDir`
 * (append-only file, `appendfsync everysec`: see README for the durability trade-off).
 * Used by `rollbox up` and by integration tests. `extraArgs` are appended to the
 * command line (e.g. the cluster options of cluster-server.ts).
 */
export async function startRedisServer(opts: { dataDir: string; port?: number; appendfsync?: 'always' | 'everysec' | 'no'; persist?: boolean; extraArgs?: string[] }): Promise<RedisServerHandle> {
  await fs.mkdir(opts.dataDir, { recursive: true });
  const port = opts.port ?? (await freePort());
  const persist = opts.persist ?? true;
  const args = [
    '--port', String(port),
    '--bind', '127.0.0.1',
    '--dir', path.resolve(opts.dataDir),
    '--save', '',
    '--appendonly', persist ? 'yes' : 'no',
    '--appendfsync', opts.appendfsync ?? 'everysec',
    '--daemonize', 'no',
    '--protected-mode', 'yes',
    '--loglevel', 'warning',
    '--logfile', '',
    ...(opts.extraArgs ?? []),
  ];
  // Its own process group: Ctrl-C in a terminal signals the whole foreground group, and
  // Redis must outlive that signal until the worker has ended its sandboxes through it.
  const child: ChildProcess = spawn('redis-server', args, { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const url = `redis://127.0.0.1:${port}`;

  // Wait until it answers PING (or died).
  const deadline = Date.now() + 10_000;
  let ready = false;
  while (!ready && Date.now() < deadline && child.exitCode === null) {
    const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
    probe.on('error', () => {});
    try {
      await probe.connect();
      ready = (await probe.ping()) === 'PONG';
    } catch {
      await new Promise((r) => setTimeout(r, 20));
    } finally {
      probe.disconnect();
    }
  }
  if (!ready) {
    child.kill('SIGKILL');
    throw new Error(`redis-server did not start on port ${port}: ${stderr.trim()}`);
  }

  let stopping: Promise<void> | undefined;
  return {
    url,
    port,
    pid: child.pid!,
    stop() {
      stopping ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) return;
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(timer);
      })();
      return stopping;
    },
  };
}

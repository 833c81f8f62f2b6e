import { renameSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import net from 'node:net';

/** sun_path holds 108 bytes with its NUL. */
export const MAX_SOCKET_PATH_BYTES = 107;

export interface InitListener {
  /** The listening socket's fd in this process: hand it to runc (`--preserve-fds`). */
  fd: number;
  /**
   * Once the init holds the socket: give it its final name and close this process's copy.
   * From then on only the init accepts connections on it.
   */
  handOver(): void;
  /** The container did not start: close and remove everything. */
  abandon(): Promise<void>;
}

/**
 * A listening socket for a sandbox's init, bound under a host directory that is never
 * mounted into any container (the private channel of rollbox-init.c).
 *
 * Node's `server.close()` unlinks the path it bound. The socket is therefore bound under
 * a temporary name and renamed to `socketPath` before this process closes its copy: the
 * unlink then misses, and the name stays with the socket the init holds.
 */
export async function listenForInit(socketPath: string): Promise<InitListener> {
  if (Buffer.byteLength(socketPath) > MAX_SOCKET_PATH_BYTES - 2) throw new Error(`init socket path ${socketPath} is longer than a unix socket path may be`);
  const tmpPath = `${socketPath}~`;
  await rm(tmpPath, { force: true });
  const server = net.createServer();
  // Connections are never accepted here: the server only exists to create the socket.
  server.on('connection', (c) => c.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ path: tmpPath, backlog: 512 }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const fd = (server as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== 'number' || fd < 0) {
    server.close();
    throw new Error('cannot get the fd of the init socket');
  }
  return {
    fd,
    handOver() {
      renameSync(tmpPath, socketPath);
      server.close();
    },
    async abandon() {
      server.close();
      await rm(tmpPath, { force: true });
      await rm(socketPath, { force: true });
    },
  };
}

import net from 'node:net';
import type { Logger } from 'pino';
import { RollboxError } from '../api/index.ts';
import { PortConnectError, readLine, type PortForwarder } from './forwarder.ts';
import type { PortTickets } from './tickets.ts';

/** A ticket is the first thing a gateway sends: short, and at once. */
const TICKET_TIMEOUT_MS = 5000;
const MAX_TICKET_BYTES = 256;

export interface PortRelayDeps {
  tickets: Pick<PortTickets, 'verify'>;
  forwarder: Pick<PortForwarder, 'open'>;
  /** The pid whose network namespace is the sandbox's (its init), for a sandbox running on this host; else a coded error. */
  netnsOf: (sandboxId: string) => Promise<number>;
  logger?: Pick<Logger, 'debug' | 'warn'>;
}

/**
 * A worker host's door for traffic into its sandboxes' ports: a TCP listener gateways
 * dial (its address is in the host's heartbeat). Each connection starts with a ticket line
 * (tickets.ts) naming one sandbox and port; the relay answers `ok` and from then on the
 * connection is a byte stream to that port, or answers `err {code, message}` and closes.
 * Whatever a gateway speaks over it (HTTP, a WebSocket after its upgrade) passes as is.
 */
export class PortRelay {
  private server: net.Server | undefined;
  private readonly open = new Set<net.Socket>();

  constructor(private readonly deps: PortRelayDeps) {}

  /** Listens; answers the address it listens at (`host:port`). */
  async listen(host: string, port: number): Promise<string> {
    const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (socket) => void this.serve(socket));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port, backlog: 1024 }, () => resolve());
    });
    this.server = server;
    const address = server.address() as net.AddressInfo;
    return `${host.includes(':') ? `[${host}]` : host}:${address.port}`;
  }

  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const socket of this.open) socket.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  private async serve(socket: net.Socket): Promise<void> {
    this.open.add(socket);
    socket.setNoDelay(true);
    socket.once('close', () => this.open.delete(socket));
    socket.on('error', () => socket.destroy());
    let upstream: net.Socket;
    try {
      const ticket = await readLine(socket, TICKET_TIMEOUT_MS, MAX_TICKET_BYTES).catch((err: Error) => {
        throw new RollboxError('invalid_request', `port relay: ${err.message}`);
      });
      const { sandboxId, port } = await this.deps.tickets.verify(ticket);
      const pid = await this.deps.netnsOf(sandboxId);
      upstream = await this.deps.forwarder.open(pid, port).catch((err: unknown) => {
        throw err instanceof PortConnectError ? portError(sandboxId, port, err) : err;
      });
    } catch (err) {
      const { code, message } = err instanceof RollboxError ? err : new RollboxError('internal', err instanceof Error ? err.message : String(err));
      this.deps.logger?.debug({ code, message }, 'port relay refused a connection');
      socket.end(`err ${JSON.stringify({ code, message })}\n`);
      return;
    }
    this.open.add(upstream);
    upstream.once('close', () => this.open.delete(upstream));
    upstream.setNoDelay(true);
    socket.write('ok\n');
    // Either side's end is passed on as a half-close; an error ends both.
    upstream.on('error', () => socket.destroy());
    socket.on('error', () => upstream.destroy());
    socket.once('close', () => upstream.destroy());
    upstream.once('close', () => socket.destroy());
    socket.pipe(upstream);
    upstream.pipe(socket);
    socket.resume();
  }
}

function portError(sandboxId: string, port: number, err: PortConnectError): RollboxError {
  if (err.errno === 'ECONNREFUSED') return new RollboxError('port_closed', `nothing listens on port ${port} in sandbox ${sandboxId} (a server there must listen on 0.0.0.0 or 127.0.0.1)`);
  if (err.errno === 'ENOENT') return new RollboxError('invalid_state', `sandbox ${sandboxId} is not running on this worker host`);
  if (err.errno === 'ETIMEDOUT') return new RollboxError('timeout', `connecting to port ${port} in sandbox ${sandboxId} timed out (is it paused?)`);
  return new RollboxError('internal', `connecting to port ${port} in sandbox ${sandboxId}: ${err.message}`);
}

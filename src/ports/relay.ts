import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { RollboxError } from '../api/index.ts';
import type { PortForwarder } from './forwarder.ts';
import type { PortTickets } from './tickets.ts';

/** The C side refuses longer ones before it asks. */
const MAX_TICKET_BYTES = 256;

export interface PortRelayDeps {
  tickets: Pick<PortTickets, 'verify'>;
  forwarder: Pick<PortForwarder, 'listenRelay' | 'stop'>;
  /** The pid whose network namespace is the sandbox's (its init), for a sandbox running on this host; else a coded error. */
  netnsOf: (sandboxId: string) => Promise<number>;
  /** Where the unix socket rollbox-portfwd asks on is made (a directory only root reads). */
  controlPath: string;
  logger?: Pick<Logger, 'debug' | 'warn'>;
}

/**
 * A worker host's door for traffic into its sandboxes' ports: a TCP listener gateways dial
 * (its address is in the host's heartbeat). Each connection starts with a ticket line
 * (tickets.ts) naming one sandbox and port; the relay answers `ok` and from then on the
 * connection is a byte stream to that port, or answers `err {code, message}` and closes.
 * Whatever a gateway speaks over it (HTTP, a WebSocket after its upgrade) passes as is.
 *
 * The listener and the bytes are rollbox-portfwd's (forwarder.ts): a child of it per
 * connection copies them between the gateway and the sandbox. What is decided here, on a
 * unix socket it asks for each connection, is whether the ticket opens a port of a sandbox
 * running on this host (its signature, its expiry, the sandbox's state): the answer is
 * `ok <netns pid> <port> <sandbox id>` or the coded refusal the gateway gets.
 */
export class PortRelay {
  private control: net.Server | undefined;

  constructor(private readonly deps: PortRelayDeps) {}

  /** Listens (`port` 0: any free one); answers the address it listens at (`host:port`). */
  async listen(host: string, port: number): Promise<string> {
    await fs.mkdir(path.dirname(this.deps.controlPath), { recursive: true, mode: 0o700 });
    // A worker process that was killed left its socket behind.
    await fs.rm(this.deps.controlPath, { force: true });
    const control = net.createServer((socket) => void this.answer(socket));
    await new Promise<void>((resolve, reject) => {
      control.once('error', reject);
      control.listen({ path: this.deps.controlPath, backlog: 1024 }, () => resolve());
    });
    this.control = control;
    const bound = await this.deps.forwarder.listenRelay(host, port, this.deps.controlPath);
    return `${host.includes(':') ? `[${host}]` : host}:${bound}`;
  }

  /** Closes the door: the helper goes, and with it every connection it relays. */
  async stop(): Promise<void> {
    this.deps.forwarder.stop();
    const control = this.control;
    this.control = undefined;
    if (control) await new Promise<void>((resolve) => control.close(() => resolve()));
  }

  /**
   * One connection of rollbox-portfwd's, made before the gateway's connection it serves came
   * (so it waits, without a bound, for its ticket): the ticket in, the verdict out.
   */
  private answer(socket: net.Socket): void {
    socket.on('error', () => socket.destroy());
    let held = '';
    const onData = (chunk: Buffer) => {
      held += chunk.toString('latin1');
      const newline = held.indexOf('\n');
      if (newline < 0 && held.length <= MAX_TICKET_BYTES) return;
      socket.off('data', onData);
      void this.verdictOn(newline < 0 ? undefined : held.slice(0, newline)).then((verdict) => socket.end(`${verdict}\n`));
    };
    socket.on('data', onData);
  }

  private async verdictOn(ticket: string | undefined): Promise<string> {
    try {
      if (ticket === undefined) throw new RollboxError('invalid_request', `port relay: line longer than ${MAX_TICKET_BYTES} bytes`);
      const { sandboxId, port } = await this.deps.tickets.verify(ticket);
      return `ok ${await this.deps.netnsOf(sandboxId)} ${port} ${sandboxId}`;
    } catch (err) {
      const { code, message } = err instanceof RollboxError ? err : new RollboxError('internal', err instanceof Error ? err.message : String(err));
      this.deps.logger?.debug({ code, message }, 'port relay refused a connection');
      return `err ${JSON.stringify({ code, message })}`;
    }
  }
}

import net from 'node:net';

export interface HostPort {
  host: string;
  port: number;
}

/**
 * How long a connection to one gateway may take before the relay tries the next: a gateway
 * whose machine is gone answers no SYN, and an agent's SDK should not spend its own timeout on it.
 */
const CONNECT_TIMEOUT_MS = 3000;

/**
 * The gateway's reach for one sandbox whose network has `gateway: true` (a hosted rollout's
 * agent sandbox): a TCP listener on the host end of its veth that pipes each connection to
 * a gateway the worker host knows. The sandbox's rules let it reach this one port of its
 * host and nothing else of the host, so the agent reaches the gateway (its API and model
 * routes, with its rollout key) and no other service, and needs no route to wherever the
 * gateway runs. With several gateways, each connection goes to the one that answered last
 * and, when that one refuses or does not answer, to the next: an agent's SDK retrying a call
 * whose gateway died reaches another (which joins or takes over the call).
 */
export class GatewayRelay {
  private readonly sockets = new Set<net.Socket>();
  /** Index (in the targets' list) of the gateway that took the last connection. */
  private preferred = 0;

  private constructor(private readonly server: net.Server) {}

  static async start(listen: HostPort, targets: () => HostPort[], onError: (err: Error) => void): Promise<GatewayRelay> {
    const server = net.createServer();
    const relay = new GatewayRelay(server);
    server.on('connection', (inbound) => relay.pipe(inbound, targets(), onError));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host: listen.host, port: listen.port, exclusive: true }, () => {
        server.off('error', reject);
        server.on('error', onError);
        resolve();
      });
    });
    return relay;
  }

  private pipe(inbound: net.Socket, targets: HostPort[], onError: (err: Error) => void): void {
    this.track(inbound);
    inbound.pause();
    // Until a gateway takes it, the agent going away ends the attempt.
    inbound.once('error', () => inbound.destroy());
    const first = this.preferred < targets.length ? this.preferred : 0;
    const attempt = (tried: number, lastError?: Error): void => {
      if (inbound.destroyed) return;
      if (tried >= targets.length) {
        inbound.destroy();
        if (lastError) onError(lastError);
        return;
      }
      const index = (first + tried) % targets.length;
      const outbound = net.connect({ ...targets[index]!, timeout: CONNECT_TIMEOUT_MS });
      const failed = (err: Error) => {
        outbound.destroy();
        attempt(tried + 1, err);
      };
      const timedOut = () => failed(new Error(`gateway ${targets[index]!.host}:${targets[index]!.port}: no answer in ${CONNECT_TIMEOUT_MS} ms`));
      outbound.once('error', failed);
      outbound.once('timeout', timedOut);
      outbound.once('connect', () => {
        outbound.off('error', failed).off('timeout', timedOut).setTimeout(0);
        this.preferred = index;
        if (inbound.destroyed) return void outbound.destroy();
        this.connect(inbound, outbound, onError);
      });
    };
    attempt(0);
  }

  private connect(inbound: net.Socket, outbound: net.Socket, onError: (err: Error) => void): void {
    this.track(outbound);
    for (const s of [inbound, outbound]) s.setNoDelay(true);
    inbound.pipe(outbound).pipe(inbound);
    inbound.resume();
    // Either side failing ends both: the agent's client sees a reset and retries.
    inbound.once('error', () => outbound.destroy());
    outbound.once('error', (err) => {
      inbound.destroy();
      if ((err as NodeJS.ErrnoException).code !== 'ECONNRESET') onError(err);
    });
    inbound.once('close', () => outbound.end());
    outbound.once('close', () => inbound.end());
  }

  private track(socket: net.Socket): void {
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
  }

  close(): void {
    this.server.close();
    for (const s of this.sockets) s.destroy();
  }
}

import net from 'node:net';

/**
 * The gateway's reach for one sandbox whose network has `gateway: true` (a hosted rollout's
 * agent sandbox): a TCP listener on the host end of its veth that pipes each connection to
 * the gateway the worker host knows. The sandbox's rules let it reach this one port of its
 * host and nothing else of the host, so the agent reaches the gateway (its API and model
 * routes, with its rollout key) and no other service, and needs no route to wherever the
 * gateway runs.
 */
export class GatewayRelay {
  private readonly sockets = new Set<net.Socket>();

  private constructor(private readonly server: net.Server) {}

  static async start(listen: { host: string; port: number }, target: { host: string; port: number }, onError: (err: Error) => void): Promise<GatewayRelay> {
    const server = net.createServer();
    const relay = new GatewayRelay(server);
    server.on('connection', (inbound) => relay.pipe(inbound, target, onError));
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

  private pipe(inbound: net.Socket, target: { host: string; port: number }, onError: (err: Error) => void): void {
    const outbound = net.connect({ host: target.host, port: target.port });
    for (const s of [inbound, outbound]) {
      this.sockets.add(s);
      s.setNoDelay(true);
      s.once('close', () => this.sockets.delete(s));
    }
    inbound.pipe(outbound).pipe(inbound);
    // Either side failing ends both: the agent's client sees a reset and retries.
    inbound.once('error', () => outbound.destroy());
    outbound.once('error', (err) => {
      inbound.destroy();
      if ((err as NodeJS.ErrnoException).code !== 'ECONNRESET') onError(err);
    });
    inbound.once('close', () => outbound.end());
    outbound.once('close', () => inbound.end());
  }

  close(): void {
    this.server.close();
    for (const s of this.sockets) s.destroy();
  }
}

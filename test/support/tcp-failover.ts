import net from 'node:net';
import type { AddressInfo } from 'node:net';

/**
 * A TCP front for several gateways, as a load balancer would be: each new connection goes
 * to the first target that accepts it (a gateway that died refuses, and the next one gets
 * the connection). An agent's SDK has one base URL; this is what is behind it.
 */
export async function startTcpFailover(targets: () => { host: string; port: number }[]): Promise<{ url: string; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    sockets.add(client);
    client.once('close', () => sockets.delete(client));
    client.pause();
    const list = targets();
    const attempt = (i: number) => {
      if (i >= list.length) return client.destroy();
      const upstream = net.connect(list[i]!);
      let connected = false;
      upstream.once('error', () => (connected ? client.destroy() : attempt(i + 1)));
      upstream.once('connect', () => {
        connected = true;
        sockets.add(upstream);
        upstream.once('close', () => {
          sockets.delete(upstream);
          client.destroy();
        });
        client.once('close', () => upstream.destroy());
        client.pipe(upstream).pipe(client);
        client.resume();
      });
    };
    client.on('error', () => {});
    attempt(0);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

import http from 'node:http';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { GatewayRelay } from '../src/workers/network/gateway-relay.ts';

// The agent sandbox's relay to several gateways (ROLLBOX_SANDBOX_GATEWAY_URL, comma-separated):
// each connection goes to the gateway that took the last one, or to the next when that one
// refuses. Real sockets on loopback; the relay listens where a sandbox's veth host end would.
const closers: (() => void)[] = [];
afterEach(() => {
  for (const close of closers.splice(0)) close();
});

async function gateway(name: string): Promise<{ port: number; close(): void }> {
  const server = http.createServer((_req, res) => res.end(name));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const close = () => {
    server.close();
    server.closeAllConnections();
  };
  closers.push(close);
  return { port: (server.address() as net.AddressInfo).port, close };
}

/** A loopback port nothing listens on (connections refused). */
async function deadPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

describe('gateway relay', () => {
  it('sends each connection to a gateway that answers, keeps to it, and moves on when it dies', async () => {
    const [a, b, dead] = [await gateway('a'), await gateway('b'), await deadPort()];
    const listen = { host: '127.0.0.1', port: await deadPort() };
    const errors: Error[] = [];
    const relay = await GatewayRelay.start(listen, () => [{ host: '127.0.0.1', port: dead }, { host: '127.0.0.1', port: a.port }, { host: '127.0.0.1', port: b.port }], (err) => errors.push(err));
    closers.push(() => relay.close());
    const ask = async () => (await fetch(`http://127.0.0.1:${listen.port}/`, { headers: { connection: 'close' } })).text();
    expect(await ask()).toBe('a');
    expect(await ask()).toBe('a');
    a.close();
    expect(await ask()).toBe('b');
    b.close();
    // None left: the connection is dropped (the agent's client sees it and retries).
    await expect(ask()).rejects.toThrow();
    expect(errors.length).toBeGreaterThan(0);
  });
});

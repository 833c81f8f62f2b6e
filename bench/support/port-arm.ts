/**
 * bench:e2b's port arm, run as its own process (client-process.ts): the caller
 * of a sandbox's port is a user's harness, browser or tool, never the stack's own process,
 * and a client in that process would take its CPU turns from the gateway's event loop and
 * lengthen the very path it times. Four GETs of the same busybox httpd page, interleaved,
 * each on a new connection (busybox httpd closes each):
 * - through `getHost` (the gateway, the worker's port relay, into the sandbox's namespace);
 * - the worker's port relay alone, with a ticket this process mints (the gateway left out);
 * - the floor: straight into the sandbox's network namespace from the host through
 *   rollbox-portfwd (one fork and setns per connection, no gateway, no relay), since a
 *   sandbox's own address is unreachable from the host (its firewall drops connections from it);
 * - context: the host's busybox httpd on its loopback, outside any sandbox's cgroup.
 * Progress on stderr; the samples as one JSON line on stdout.
 */
import fs from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { PortForwarder, PortTickets } from '../../src/ports/index.ts';
import { runInClientProcess, serveClientProcess, timedInTurn } from './client-process.ts';

export interface PortArmInput {
  runs: number;
  page: string;
  gatewayPort: number;
  /** `getHost(port)` of the sandbox and its traffic token. */
  getHost: string;
  trafficToken: string;
  /** The worker's port relay (`host:port`), Redis (for its ticket secret), the sandbox and its port. */
  relay: string;
  redisUrl: string;
  sandboxId: string;
  port: number;
  /** The sandbox's init: its network namespace. */
  initPid: number;
  /** A busybox httpd serving `page` on the host's loopback. */
  hostPort: number;
}

export interface PortArmSamples {
  getHost: number[];
  relayOnly: number[];
  floor: number[];
  hostLoopback: number[];
}

/** Runs the arm in a process of its own; resolves with its samples. */
export function runPortArm(input: PortArmInput): Promise<PortArmSamples> {
  return runInClientProcess(import.meta.filename, 'the port arm', input);
}

/** One GET of `/index.html` on a new connection (to `to` on the loopback, or over a socket); its body must be `page`. */
function get(to: number | net.Socket, host: string, page: string, headers: Record<string, string> = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    const where = typeof to === 'number' ? { host: '127.0.0.1', port: to, agent: false as const } : { createConnection: () => to };
    const req = http.request({ ...where, path: '/index.html', headers: { host, ...headers } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => (res.statusCode === 200 && body === page ? resolve() : reject(new Error(`${res.statusCode}: ${body.slice(0, 200)}`))));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

async function main(input: PortArmInput): Promise<PortArmSamples> {
  const redis = new Redis(input.redisUrl);
  const tickets = new PortTickets(redis);
  const forwarderDir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-bench-portfwd-'));
  const forwarder = new PortForwarder({ dir: forwarderDir });
  const [relayHost, relayPort] = input.relay.split(':') as [string, string];
  const inSandbox = `localhost:${input.port}`;
  const viaGetHost = () => get(input.gatewayPort, input.getHost, input.page, { 'e2b-traffic-access-token': input.trafficToken });
  const viaRelayOnly = async () => {
    const socket = net.connect({ host: relayHost, port: Number(relayPort) });
    socket.setNoDelay(true);
    socket.write(`${await tickets.mint({ sandboxId: input.sandboxId, port: input.port })}\n`);
    await new Promise<void>((resolve, reject) => {
      let answer = '';
      const onData = (chunk: Buffer) => {
        answer += chunk.toString();
        if (!answer.includes('\n')) return;
        socket.off('data', onData);
        if (answer.startsWith('ok\n')) resolve();
        else reject(new Error(`relay answered ${answer}`));
      };
      socket.on('data', onData);
      socket.once('error', reject);
    });
    await get(socket, inSandbox, input.page);
  };
  const intoNetns = async () => get(await forwarder.open(input.initPid, input.port), inSandbox, input.page);
  const onHost = () => get(input.hostPort, `127.0.0.1:${input.hostPort}`, input.page);
  try {
    for (let i = 0; i < 50; i++) await Promise.all([viaGetHost(), viaRelayOnly(), intoNetns(), onHost().catch(() => undefined)]);
    await onHost();
    return await timedInTurn('GET through getHost, the relay alone, into the netns, on the host', input.runs, { getHost: viaGetHost, relayOnly: viaRelayOnly, floor: intoNetns, hostLoopback: onHost });
  } finally {
    forwarder.stop();
    redis.disconnect();
    await fs.rm(forwarderDir, { recursive: true, force: true });
  }
}

await serveClientProcess(import.meta.filename, main);

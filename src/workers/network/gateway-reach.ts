import { lookup } from 'node:dns/promises';
import net from 'node:net';

/** A gateway as configured (`ROLLBOX_SANDBOX_GATEWAY_URL`): a host name or address, and a port. */
export interface HostPort {
  host: string;
  port: number;
}

/** A gateway as the kernel's DNAT rule names it: an IPv4 address and a port. */
export interface GatewayAddress {
  address: string;
  port: number;
}

/**
 * How long a gateway may take to accept a probe's connection: a gateway whose machine is
 * gone answers no SYN, and the agents should be sent to the next one well before their SDKs
 * give up on a call.
 */
const PROBE_TIMEOUT_MS = 1000;

/** Whether something accepts TCP connections at `address:port` within the timeout. */
function accepts(target: GatewayAddress, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: target.address, port: target.port, timeout: timeoutMs });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
    socket.once('timeout', () => done(false));
  });
}

/** Where the kernel can send packets for `host`: an unspecified address (a gateway listening on all of them, as in the Docker image) is this machine's loopback. */
async function ipv4Of(host: string): Promise<string | undefined> {
  if (host === '0.0.0.0' || host === '::' || host === '[::]') return '127.0.0.1';
  if (net.isIPv4(host)) return host;
  return lookup(host, { family: 4 }).then(
    (r) => r.address,
    () => undefined,
  );
}

/**
 * The gateway an agent sandbox's `gateway.rollbox.internal:9180` should reach now: the first
 * of `targets`, in their configured order, that accepts a connection (all probed at once).
 * Undefined when none does.
 */
export async function firstLiveGateway(targets: readonly HostPort[], timeoutMs = PROBE_TIMEOUT_MS): Promise<GatewayAddress | undefined> {
  const probed = await Promise.all(
    targets.map(async (t) => {
      const address = await ipv4Of(t.host);
      const target = address && { address, port: t.port };
      return target && (await accepts(target, timeoutMs)) ? target : undefined;
    }),
  );
  return probed.find((t) => t !== undefined);
}

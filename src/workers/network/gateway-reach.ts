import { createHash } from 'node:crypto';
import { lookup } from 'node:dns/promises';
import net from 'node:net';
import type { NetworkLogger } from './host-firewall.ts';

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
 * The gateways that accept a connection now (all probed at once), in the order of
 * `targets`: the first is where an agent sandbox's `gateway.rollbox.internal:9180` should go.
 */
export async function liveGateways(targets: readonly HostPort[], timeoutMs = PROBE_TIMEOUT_MS): Promise<GatewayAddress[]> {
  const probed = await Promise.all(
    targets.map(async (t) => {
      const address = await ipv4Of(t.host);
      const target = address && { address, port: t.port };
      return target && (await accepts(target, timeoutMs)) ? target : undefined;
    }),
  );
  return probed.filter((t) => t !== undefined);
}

const sameGateway = (a: GatewayAddress, b: GatewayAddress | undefined) => a.address === b?.address && a.port === b.port;

/**
 * The configured gateways in this host's order of preference: the list rotated by a hash of
 * the node id, so the agents of many hosts spread over the gateways (each host's on one,
 * the next in the list its fallback) instead of all landing on the first.
 */
export function inHostOrder<T>(targets: readonly T[], nodeId: string): T[] {
  if (targets.length < 2) return [...targets];
  const start = createHash('sha256').update(nodeId).digest().readUInt32BE(0) % targets.length;
  return [...targets.slice(start), ...targets.slice(0, start)];
}

/** How often the worker checks that agent sandboxes' gateway still answers, while it has any. */
const PROBE_INTERVAL_MS = 1000;

export interface GatewayReachDeps {
  nodeId: string;
  /** The gateways as this host reaches them (asked at each probe). */
  targets: () => HostPort[];
  /** Whether the host has agent sandboxes now (the probe stops when it has none). */
  inUse: () => boolean;
  /** Points the kernel's DNAT rule at `target` (renderGatewayDnat). */
  point: (target: GatewayAddress) => Promise<void>;
  /**
   * After a move, resets the agent sandboxes' connections to the old gateway: those still
   * being opened (`opening`), or, when the old gateway stopped answering, all of them (`all`).
   */
  resetConnections: (which: 'opening' | 'all') => Promise<void>;
  log?: NetworkLogger;
}

/**
 * Which gateway one host's agent sandboxes reach: probed each second while it has any, the
 * DNAT rule pointed at the first of `targets` (in the host's order) that answers, and left as
 * it is when none does (the last one may come back, and nothing else would serve).
 */
export class GatewayReach {
  /** The gateway the rule names (undefined: none yet, since this worker started or its table was made). */
  private target: GatewayAddress | undefined;
  private probed: { answering: boolean; checkedAtMs: number } | undefined;
  private pointing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly deps: GatewayReachDeps) {}

  /** An agent sandbox is here: the rule in place (probed now if it names none yet), and the probe running. */
  async ensure(): Promise<void> {
    if (this.target === undefined) await this.probe();
    this.timer ??= setInterval(() => {
      if (!this.deps.inUse()) {
        clearInterval(this.timer);
        this.timer = undefined;
        this.probed = undefined;
        return;
      }
      this.probe().catch((err: unknown) => this.deps.log?.warn({ err: String(err) }, 'could not point agent sandboxes at a live gateway'));
    }, PROBE_INTERVAL_MS).unref();
  }

  /** The host's table was removed: the rule with it. */
  forget(): void {
    this.target = undefined;
  }

  /** For the heartbeat (`network.gateway`), while the host has agent sandboxes. */
  status(): { target?: string; answering: boolean; checkedAtMs: number } | undefined {
    const { target } = this;
    return this.probed && { ...(target ? { target: `${target.address}:${target.port}` } : {}), ...this.probed };
  }

  /** One probe at a time. */
  private probe(): Promise<void> {
    this.pointing ??= (async () => {
      const answering = await liveGateways(inHostOrder(this.deps.targets(), this.deps.nodeId));
      const live = answering[0];
      this.probed = { answering: live !== undefined, checkedAtMs: Date.now() };
      if (!live || sameGateway(live, this.target)) return;
      await this.deps.point(live);
      const from = this.target;
      this.target = live;
      if (!from) return;
      // A gateway that went away leaves its calls' connections silent (its machine answers
      // nothing, not even a reset) until the agents' SDKs time out, minutes later: reset, they
      // retry at once through the new rule and join their calls there. One that still answers
      // (the host moving back to its first) keeps the calls it serves.
      const gone = !answering.some((g) => sameGateway(g, from));
      this.deps.log?.warn({ from, to: live, fromAnswering: !gone }, 'agent sandboxes now reach another gateway');
      await this.deps.resetConnections(gone ? 'all' : 'opening');
    })().finally(() => {
      this.pointing = undefined;
    });
    return this.pointing;
  }
}

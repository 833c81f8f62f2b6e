import { STATUS_CODES, type IncomingMessage, type Server } from 'node:http';
import type http from 'node:http';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import type { Duplex } from 'node:stream';
import { RollboxError, isTerminal, type Sandbox } from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import type { Forwarding, PortProxy } from '../ports/index.ts';
import type { SandboxRegistry } from '../registry/index.ts';

/**
 * What @hono/node-server hands a handler as `c.env`: the Node request and response; for an
 * upgrade (roles/gateway.ts passes those through the app too), the client's socket and
 * the bytes read past the request's head instead of a response.
 */
export interface NodeBindings {
  incoming: http.IncomingMessage;
  outgoing?: http.ServerResponse;
  upgrade?: { socket: Duplex; head: Buffer };
}

/**
 * A handler's answer when it wrote the response itself (@hono/node-server then leaves it
 * alone). A fresh one each time (middleware adds headers to it), of the class the server's
 * own constant has: the global Response the server installs is written out as it is.
 */
const SentResponse = RESPONSE_ALREADY_SENT.constructor as typeof Response;
export const alreadySent = () => new SentResponse(null, { headers: { 'x-hono-already-sent': 'true' } });

/**
 * How long the record of a running sandbox routes its port traffic without being read again.
 * A page's assets, an SDK's polling, a WebSocket's reconnects: each request would otherwise
 * begin with a Redis round trip (about a fifth of what the gateway adds to one). What the
 * record gives the gateway is its tenant, tier and traffic setting, which never change, and
 * its host; whether it still runs there the host's relay checks on every connection (a
 * paused, hibernating, deleted or moved sandbox is refused there, and its record read again).
 */
const ROUTE_TTL_MS = 2000;
const MAX_ROUTES = 10_000;

/**
 * Traffic into a port of a sandbox (src/ports): rollbox's `/v1/sandboxes/:id/ports/:port/...`
 * for the sandbox's tenant, and E2B's `getHost` names (e2b/ports.ts). Either way the sandbox
 * must run, in the container tier, and the request passes to the worker host running it.
 */
export class PortsService {
  /** Running sandboxes' records, by id, oldest first (see ROUTE_TTL_MS). */
  private readonly routes = new Map<string, { sandbox: Sandbox; untilMs: number }>();

  constructor(private readonly deps: { registry: Pick<SandboxRegistry, 'get'>; proxy: Pick<PortProxy, 'http' | 'upgrade'>; now?: () => number }) {}

  /** A sandbox of the caller's tenant (another tenant's is `not_found`, as everywhere) that runs. */
  async ofTenant(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandbox:exec');
    const sandbox = await this.record(id);
    if (!sandbox || sandbox.tenant !== principal.tenant) throw new RollboxError('not_found', `sandbox ${id} not found`);
    return reachable(sandbox);
  }

  /** A sandbox by id alone (the E2B host name; its traffic token is checked by the caller): `not_found` unless it lives. */
  async byId(id: string): Promise<Sandbox> {
    return living(id, await this.record(id));
  }

  /** Passes the request (an HTTP request, or an upgrade) to `port` of the sandbox; answers once the response is the server's. */
  async pass(sandbox: Sandbox, port: number, forwarding: Forwarding, env: NodeBindings): Promise<Response> {
    reachable(sandbox);
    const target = { sandboxId: sandbox.id, port };
    try {
      if (env.upgrade) await this.deps.proxy.upgrade(sandbox.node!, target, forwarding, env.incoming, env.upgrade.socket, env.upgrade.head);
      else await this.deps.proxy.http(sandbox.node!, target, forwarding, env.incoming, env.outgoing!);
    } catch (err) {
      // Refused by its host (or the host is gone): what its record says now explains it best.
      if (!(err instanceof RollboxError) || (err.code !== 'invalid_state' && err.code !== 'unavailable') || !this.routes.delete(sandbox.id)) throw err;
      reachable(living(sandbox.id, await this.record(sandbox.id)));
      throw err;
    }
    return alreadySent();
  }

  /** The sandbox's record: a running one's from `routes` while fresh, else read (and kept if it runs). */
  private async record(id: string): Promise<Sandbox | undefined> {
    const nowMs = (this.deps.now ?? Date.now)();
    const route = this.routes.get(id);
    if (route && route.untilMs > nowMs) return route.sandbox;
    this.routes.delete(id);
    const sandbox = await this.deps.registry.get(id);
    if (sandbox?.state === 'running' && sandbox.node) {
      this.routes.set(id, { sandbox, untilMs: nowMs + ROUTE_TTL_MS });
      if (this.routes.size > MAX_ROUTES) this.routes.delete(this.routes.keys().next().value!);
    }
    return sandbox;
  }
}

function living(id: string, sandbox: Sandbox | undefined): Sandbox {
  if (!sandbox || isTerminal(sandbox.state)) throw new RollboxError('not_found', `sandbox ${id} not found`);
  return sandbox;
}

function reachable(sandbox: Sandbox): Sandbox {
  if (sandbox.spec.tier === 'microvm') throw new RollboxError('tier_unsupported', `sandbox ${sandbox.id} is a microVM: traffic into its ports is not proxied yet`);
  if (sandbox.state !== 'running' || !sandbox.node) {
    const hint = sandbox.state === 'paused' || sandbox.state === 'hibernated' ? '; resume it first' : '';
    throw new RollboxError('invalid_state', `sandbox ${sandbox.id} is ${sandbox.state}, not running${hint}`);
  }
  return sandbox;
}

/** Whether a port number is one a request may name (1-65535). */
export function parsePort(text: string): number {
  const port = /^\d{1,5}$/.test(text) ? Number(text) : 0;
  if (port < 1 || port > 65_535) throw new RollboxError('invalid_request', `port ${text} is not a TCP port (1-65535)`);
  return port;
}

/**
 * Upgrade requests (WebSockets) go through the app like any request: its routes, auth and
 * error answers; a handler that takes one (the port proxy) answers `alreadySent`, any other
 * answer is written to the socket and the connection closed. Node closes upgrades nobody
 * listens for, so without this no WebSocket reaches a sandbox.
 */
export function serveUpgrades(server: Server, fetch: (request: Request, env: NodeBindings) => Response | Promise<Response>): void {
  server.on('upgrade', (incoming: IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on('error', () => socket.destroy());
    const headers = new Headers();
    for (const [name, value] of Object.entries(incoming.headers)) if (value !== undefined) headers.append(name, Array.isArray(value) ? value.join(', ') : value);
    const request = new Request(`http://${incoming.headers.host ?? 'localhost'}${incoming.url ?? '/'}`, { method: incoming.method ?? 'GET', headers });
    void (async () => {
      const response = await fetch(request, { incoming, upgrade: { socket, head } });
      if (response.headers.get('x-hono-already-sent')) return;
      const body = Buffer.from(await response.arrayBuffer());
      const type = response.headers.get('content-type') ?? 'application/json';
      socket.end(Buffer.concat([Buffer.from(`HTTP/1.1 ${response.status} ${STATUS_CODES[response.status] ?? ''}\r\nContent-Type: ${type}\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`), body]));
    })().catch(() => socket.destroy());
  });
}

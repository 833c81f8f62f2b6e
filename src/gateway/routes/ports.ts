import type { Context } from 'hono';
import type { GatewayEnv } from '../auth.ts';
import { parsePort, type NodeBindings, type PortsService } from '../ports-service.ts';
import type { GatewayApp } from './common.ts';

/** Request headers that are rollbox's and stay at the gateway: the caller's token. */
const ROLLBOX_HEADERS: ReadonlySet<string> = new Set(['authorization', 'x-api-key']);

/**
 * `ANY /v1/sandboxes/:id/ports/:port/<path>`: the request, body streamed, goes to `<path>` on
 * that TCP port inside the caller's sandbox (a server there listening on 0.0.0.0 or
 * 127.0.0.1), and the server's answer streams back as it is. A WebSocket (any upgrade) on
 * such a path is passed through the same way. The caller's token stays at the gateway.
 */
export function registerPortRoutes(app: GatewayApp, ports: Pick<PortsService, 'ofTenant' | 'pass'>): void {
  const handler = async (c: Context<GatewayEnv>) => {
    const { id, port: portText } = c.req.param() as { id: string; port: string };
    const port = parsePort(portText);
    const sandbox = await ports.ofTenant(c.get('principal'), id);
    const env = c.env as NodeBindings;
    const url = env.incoming.url ?? '/';
    const prefix = `/v1/sandboxes/${id}/ports/${portText}`;
    const rest = url.slice(url.indexOf(prefix) + prefix.length);
    const path = rest.startsWith('/') ? rest : `/${rest}`;
    return ports.pass(sandbox, port, { path, host: `localhost:${port}`, drop: ROLLBOX_HEADERS }, env);
  };
  app.all('/v1/sandboxes/:id/ports/:port', handler);
  app.all('/v1/sandboxes/:id/ports/:port/*', handler);
}

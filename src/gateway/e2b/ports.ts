import { timingSafeEqual } from 'node:crypto';
import type { MiddlewareHandler } from 'hono';
import { RollboxError } from '../../api/index.ts';
import type { GatewayEnv } from '../auth.ts';
import { parsePort, type NodeBindings, type PortsService } from '../ports-service.ts';
import type { EnvdAccess } from './access.ts';

/** `getHost(port)`'s name, `<port>-<sandbox id>.<domain>`; envd's own port (49983) is envd.ts's. */
const PORT_HOST = /^(\d{1,5})-(sbx_[a-z0-9]+)\./;
const ENVD_PORT = '49983';
/** E2B's header for a sandbox created without public traffic (sandbox.trafficAccessToken). */
export const TRAFFIC_TOKEN_HEADER = 'e2b-traffic-access-token';
const GATEWAY_HEADERS: ReadonlySet<string> = new Set([TRAFFIC_TOKEN_HEADER]);

/**
 * Requests whose Host is an E2B sandbox's `getHost(port)` name go to that port of the
 * sandbox, whatever their path (registered before every route). A sandbox created without
 * `allowPublicTraffic` takes only requests carrying its traffic access token, which stays
 * at the gateway; a public one takes any. Its tenant's API key is not needed: the name is
 * the address, as on E2B.
 */
export function e2bPortHosts(deps: { ports: Pick<PortsService, 'byId' | 'pass'>; access: Pick<EnvdAccess, 'tokenFor'> }): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    const host = c.req.header('host') ?? '';
    const m = PORT_HOST.exec(host);
    if (!m || m[1] === ENVD_PORT) return next();
    const port = parsePort(m[1]!);
    const sandbox = await deps.ports.byId(m[2]!);
    if (!sandbox.spec.publicTraffic) {
      const given = Buffer.from(c.req.header(TRAFFIC_TOKEN_HEADER) ?? '');
      if (!given.length) throw new RollboxError('forbidden', `sandbox ${sandbox.id} takes traffic only with its ${TRAFFIC_TOKEN_HEADER} header (created without allowPublicTraffic)`);
      const expected = Buffer.from(await deps.access.tokenFor(sandbox.id, sandbox.tenant));
      if (given.length !== expected.length || !timingSafeEqual(given, expected)) throw new RollboxError('forbidden', `${TRAFFIC_TOKEN_HEADER} is not the traffic access token of sandbox ${sandbox.id}`);
    }
    const env = c.env as NodeBindings;
    return deps.ports.pass(sandbox, port, { path: env.incoming.url ?? '/', host, drop: GATEWAY_HEADERS }, env);
  };
}

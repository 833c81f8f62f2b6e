import type { GatewayApp } from '../routes/common.ts';
import type { Redis } from 'ioredis';
import type { E2bKeyStore } from '../../iam/index.ts';
import type { SandboxRegistry } from '../../registry/index.ts';
import { EnvdAccess } from './access.ts';
import { registerE2bControl, type E2bControlDeps } from './control.ts';
import { registerE2bEnvd, type E2bEnvdDeps } from './envd.ts';

export { ENVD_VERSION } from './control.ts';
export { ConnectError, envelope } from './connect.ts';

export interface E2bDeps {
  redis: Redis;
  registry: Pick<SandboxRegistry, 'get'>;
  keys: Pick<E2bKeyStore, 'verify'>;
  sandboxes: E2bControlDeps['sandboxes'];
  ttls: E2bControlDeps['ttls'];
  execs: E2bEnvdDeps['execs'];
  files: E2bEnvdDeps['files'];
  filesMaxBytes: number;
}

/**
 * The E2B surface (docs/e2b.md): the official `e2b` SDK runs against rollbox with
 * E2B_API_URL and E2B_SANDBOX_URL both set to the gateway's URL. Its control plane at
 * E2B's REST paths (authenticated by `X-API-Key`), and envd for every sandbox at the same
 * origin, routed by the `E2b-Sandbox-Id` header.
 */
export function registerE2b(app: GatewayApp, deps: E2bDeps): void {
  const access = new EnvdAccess(deps.redis);
  registerE2bControl(app, { sandboxes: deps.sandboxes, ttls: deps.ttls, keys: deps.keys, access });
  registerE2bEnvd(app, { redis: deps.redis, registry: deps.registry, access, execs: deps.execs, files: deps.files, filesMaxBytes: deps.filesMaxBytes });
}

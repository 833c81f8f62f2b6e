import type { GatewayApp } from '../routes/common.ts';
import type { Redis } from 'ioredis';
import type { PauseMode } from '../../api/index.ts';
import type { E2bKeyStore, Principal } from '../../iam/index.ts';
import type { LayerRegistry, SandboxRegistry } from '../../registry/index.ts';
import type { ExecService } from '../exec-service.ts';
import { EnvdAccess } from './access.ts';
import { registerE2bControl, type E2bControlDeps } from './control.ts';
import { registerE2bState, type E2bStateDeps } from './control-state.ts';
import { registerE2bEnvd, type E2bEnvdDeps } from './envd.ts';
import { E2bTemplates, type BaseTemplateSource } from './templates.ts';
import { registerE2bUnserved } from './unserved.ts';
import { registerE2bTemplateBuilds, startTemplate, type E2bBuildsDeps } from './template-builds.ts';

export { ENVD_VERSION } from './control-common.ts';
export { ConnectError, envelope } from './connect.ts';
export { signatureOf } from './signed-urls.ts';
export { e2bPortHosts, TRAFFIC_TOKEN_HEADER } from './ports.ts';
export { EnvdAccess } from './access.ts';
export type { BaseTemplateSource } from './templates.ts';

export interface E2bDeps {
  redis: Redis;
  registry: Pick<SandboxRegistry, 'get'>;
  keys: Pick<E2bKeyStore, 'verify'>;
  sandboxes: E2bControlDeps['sandboxes'] & E2bStateDeps['sandboxes'];
  ttls: E2bControlDeps['ttls'];
  forks: E2bStateDeps['forks'];
  metrics: E2bStateDeps['metrics'];
  layers: Pick<LayerRegistry, 'resolve' | 'unname'>;
  execs: E2bEnvdDeps['execs'] & Pick<ExecService, 'exec' | 'startBackground'>;
  files: E2bEnvdDeps['files'];
  filesMaxBytes: number;
  /** The cluster's base template (none: E2B's `base` is busybox). */
  baseTemplate: BaseTemplateSource | undefined;
  /** The E2B settings of the config (ROLLBOX_E2B_*). */
  options: { pauseMode: PauseMode; pausedTtlSeconds: number; baseTemplateWaitMs: number; domain: string };
  /** E2B's template builds through rollbox's image builds (none: not served). */
  builds?: Omit<E2bBuildsDeps, 'redis' | 'keys'>;
}

/**
 * The E2B surface (docs/e2b.md): the official `e2b` SDK runs against rollbox with
 * E2B_API_URL and E2B_SANDBOX_URL both set to the gateway's URL. Its control plane at
 * E2B's REST paths (authenticated by `X-API-Key`), and envd for every sandbox at the same
 * origin, routed by the `E2b-Sandbox-Id` header.
 */
export function registerE2b(app: GatewayApp, deps: E2bDeps): void {
  const { redis, keys, sandboxes, options } = deps;
  const access = new EnvdAccess(redis);
  const templates = new E2bTemplates({ layers: deps.layers, base: deps.baseTemplate, baseWaitMs: options.baseTemplateWaitMs });
  const starts = deps.builds ? { startTemplate: (principal: Principal, sandboxId: string, template: string) => startTemplate({ redis, execs: deps.execs, sandboxes }, principal, sandboxId, template) } : {};
  registerE2bControl(app, { sandboxes, ttls: deps.ttls, keys, access, templates, pause: { mode: options.pauseMode, pausedTtlSeconds: options.pausedTtlSeconds }, domain: options.domain, ...starts });
  registerE2bState(app, { redis, sandboxes, forks: deps.forks, metrics: deps.metrics, layers: deps.layers, keys, access, domain: options.domain });
  registerE2bEnvd(app, { redis, registry: deps.registry, access, execs: deps.execs, files: deps.files, filesMaxBytes: deps.filesMaxBytes, sandboxes, ttls: deps.ttls });
  if (deps.builds) registerE2bTemplateBuilds(app, { ...deps.builds, redis, keys });
  // Last: what is left of E2B's paths answers in E2B's shape.
  registerE2bUnserved(app, { keys });
}

import type { GatewayApp } from '../routes/common.ts';
import { RollboxError } from '../../api/index.ts';
import type { E2bKeyStore } from '../../iam/index.ts';
import { routeOf } from './control-common.ts';

/** E2B's API areas rollbox does not serve, each with how rollbox differs (docs/e2b.md). */
const AREAS: [paths: string[], why: string][] = [
  [['/templates', '/templates/*', '/v2/templates/*', '/v3/templates', '/v3/templates/*'], "this call of E2B's template API is not served by rollbox: Template.build is (its files, build and status calls); a template is an image name, `base` rollbox's E2B-like base template (docs/images.md)"],
  [['/volumes', '/volumes/*', '/volumecontent/*'], 'volumes are not supported by rollbox: a sandbox has its own disk; carry files with the files API, snapshots or forks'],
  [['/secrets', '/secrets/*'], 'secrets are not supported by rollbox: pass values in envs'],
  [['/sandboxes/*', '/v2/sandboxes/*', '/v3/sandboxes', '/v3/sandboxes/*'], 'this sandbox call is not served by rollbox (docs/e2b.md lists what is)'],
];

/**
 * What is left of E2B's control plane answers in E2B's `{code, message}` shape (not
 * rollbox's), 501 `not_implemented` with a message naming the difference, so the SDK shows
 * the reason instead of `[object Object]`. Registered after every served route.
 */
export function registerE2bUnserved(app: GatewayApp, deps: { keys: Pick<E2bKeyStore, 'verify'> }): void {
  const route = routeOf(deps.keys);
  for (const [paths, why] of AREAS) {
    for (const path of paths) {
      app.all(
        path,
        route(async (c) => {
          throw new RollboxError('not_implemented', `${c.req.method} ${c.req.path}: ${why}`);
        }),
      );
    }
  }
}

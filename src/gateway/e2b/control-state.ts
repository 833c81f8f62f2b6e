import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { GatewayApp } from '../routes/common.ts';
import { E2bForkBody, E2bMetricsQuery, E2bNetworkUpdate, E2bSnapshotBody, E2bSnapshotRecord, E2bSnapshotsQuery, RollboxError, httpStatusOf, isErrorCode } from '../../api/index.ts';
import { readerOf, type E2bKeyStore } from '../../iam/index.ts';
import type { LayerRegistry } from '../../registry/index.ts';
import type { ForkService } from '../fork-service.ts';
import type { SandboxMetricsService } from '../sandbox-metrics.ts';
import type { SandboxService } from '../sandbox-service.ts';
import type { EnvdAccess } from './access.ts';
import { DEFAULT_TIMEOUT_SECONDS, jsonOf, liveSandbox, parse, routeOf, sandboxBody } from './control-common.ts';
import { networkOf } from './network.ts';

export interface E2bStateDeps {
  redis: Redis;
  sandboxes: Pick<SandboxService, 'get' | 'snapshot' | 'setPolicy'>;
  forks: Pick<ForkService, 'forkSandbox'>;
  metrics: Pick<SandboxMetricsService, 'sample'>;
  layers: Pick<LayerRegistry, 'unname'>;
  keys: Pick<E2bKeyStore, 'verify'>;
  access: Pick<EnvdAccess, 'tokenFor'>;
  /** The sandboxes' domain (see control.ts). */
  domain: string;
}

/** A tenant's E2B snapshots (snapshotID -> E2bSnapshotRecord JSON): the layers are global, the index is the tenant's. */
const snapshotsKey = (tenant: string) => `rb:{tenant:${tenant}}:e2b-snapshots`;

/**
 * E2B's calls on a sandbox's state over rollbox's: a snapshot is rollbox's snapshot
 * (pack_diff: the writable layer, as a named layer on the sandbox's own), which
 * `Sandbox.create(snapshotId)` stacks again; fork is rollbox's fork (files: each child a
 * fresh sandbox over the parent's files); getMetrics one sample from the sandbox's
 * cgroups; updateNetwork a stage change of the network policy.
 */
export function registerE2bState(app: GatewayApp, deps: E2bStateDeps): void {
  const { redis, sandboxes, forks, access, domain } = deps;
  const route = routeOf(deps.keys);

  app.post(
    '/sandboxes/:id/snapshots',
    route(async (c, principal) => {
      const { name } = parse(E2bSnapshotBody, await jsonOf(c), 'body');
      const sandbox = await liveSandbox(sandboxes, principal, c.req.param('id')!);
      // A layer name (kept from garbage collection) the tenant's index maps back; E2B's names are free text.
      const snapshotID = `e2b-snapshot-${randomBytes(8).toString('hex')}`;
      await sandboxes.snapshot(principal, sandbox.id, { name: snapshotID, exclude: [] });
      const record: E2bSnapshotRecord = { snapshotID, sandboxID: sandbox.id, names: [snapshotID, ...(name ? [name] : [])], createdAt: new Date().toISOString() };
      await redis.hset(snapshotsKey(principal.tenant), snapshotID, JSON.stringify(record));
      return c.json({ snapshotID, names: record.names }, 201);
    }),
  );

  app.get(
    '/snapshots',
    route(async (c, principal) => {
      const query = parse(E2bSnapshotsQuery, c.req.query(), 'query');
      const all = Object.values(await redis.hgetall(snapshotsKey(principal.tenant)))
        .map((json) => E2bSnapshotRecord.parse(JSON.parse(json)))
        .filter((s) => (query.sandboxID === undefined || s.sandboxID === query.sandboxID) && (query.name === undefined || s.names.includes(query.name)))
        .sort((a, b) => b.createdAt.localeCompare(a.createdAt) || a.snapshotID.localeCompare(b.snapshotID));
      const offset = Number(query.nextToken ?? 0) || 0;
      if (offset + query.limit < all.length) c.header('X-Next-Token', String(offset + query.limit));
      return c.json(all.slice(offset, offset + query.limit).map(({ snapshotID, names }) => ({ snapshotID, names })), 200);
    }),
  );

  // E2B deletes a snapshot as a template; only the tenant's own snapshots are templates it may delete here.
  app.delete(
    '/templates/:id',
    route(async (c, principal) => {
      const id = c.req.param('id')!;
      if (!(await redis.hexists(snapshotsKey(principal.tenant), id))) throw new RollboxError('not_found', `snapshot ${id} not found (rollbox has no template API: only snapshots are deleted here)`);
      await deps.layers.unname(id, readerOf(principal)).catch((err: unknown) => {
        if (!(err instanceof RollboxError && err.code === 'not_found')) throw err;
      });
      await redis.hdel(snapshotsKey(principal.tenant), id);
      return c.body(null, 204);
    }),
  );

  app.post(
    '/sandboxes/:id/fork',
    route(async (c, principal) => {
      const { timeout, count } = parse(E2bForkBody, await jsonOf(c), 'body');
      const parent = await liveSandbox(sandboxes, principal, c.req.param('id')!);
      const { result } = await forks.forkSandbox(principal, parent.id, { count: count ?? 1, ttlSeconds: timeout ?? DEFAULT_TIMEOUT_SECONDS }, undefined);
      const children = await Promise.all(
        result.children.map(async (child) => {
          if (child.error || !child.id) {
            const code = isErrorCode(child.error?.code) ? httpStatusOf(child.error.code) : 500;
            return { error: { code, message: child.error ? `${child.error.code}: ${child.error.message}` : 'the child was not created' } };
          }
          return { sandbox: await sandboxBody(access, await sandboxes.get(principal, child.id), domain) };
        }),
      );
      return c.json(children, 200);
    }),
  );

  app.get(
    '/sandboxes/:id/metrics',
    route(async (c, principal) => {
      parse(E2bMetricsQuery, c.req.query(), 'query');
      const sandbox = await liveSandbox(sandboxes, principal, c.req.param('id')!);
      // One sample, now: rollbox keeps no history of them (E2B's start and end select from one).
      return c.json([await deps.metrics.sample(principal, sandbox.id)], 200);
    }),
  );

  app.put(
    '/sandboxes/:id/network',
    route(async (c, principal) => {
      const body = parse(E2bNetworkUpdate, await jsonOf(c), 'body');
      if (body.rules && Object.keys(body.rules).length) throw new RollboxError('not_implemented', 'network rules (request transforms) are not supported by rollbox');
      if (body.egressProxy) throw new RollboxError('not_implemented', 'an egress proxy is not supported by rollbox');
      const sandbox = await liveSandbox(sandboxes, principal, c.req.param('id')!);
      const network = networkOf({ allowOut: body.allowOut, denyOut: body.denyOut, allowInternetAccess: body.allow_internet_access }) ?? { mode: 'none', allow: [] };
      await sandboxes.setPolicy(principal, sandbox.id, { network });
      return c.body(null, 204);
    }),
  );
}

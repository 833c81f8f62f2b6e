import { createRoute, z } from '@hono/zod-openapi';
import { Pool, PoolList, PoolName, PutPoolRequest } from '../../api/index.ts';
import type { PoolService } from '../pool-service.ts';
import { errors, json, jsonBody, security, type GatewayApp } from './common.ts';

export type PoolApi = Pick<PoolService, 'put' | 'get' | 'list' | 'delete'>;

const NameParam = z.object({ name: PoolName });

/** Warm pools (scope admin): define, read with their status, delete. */
export function registerPoolRoutes(app: GatewayApp, pools: PoolApi): void {
  app.openapi(
    createRoute({ method: 'put', path: '/v1/pools/{name}', security, request: { params: NameParam, body: jsonBody(PutPoolRequest) }, responses: { 200: json(Pool, 'the pool as stored, with its status'), ...errors('not_found', 'payload_too_large') } }),
    async (c) => c.json(await pools.put(c.get('principal'), c.req.valid('param').name, c.req.valid('json')), 200),
  );
  app.openapi(createRoute({ method: 'get', path: '/v1/pools', security, responses: { 200: json(PoolList, 'every pool with its status'), ...errors() } }), async (c) => c.json({ pools: await pools.list(c.get('principal')) }, 200));
  app.openapi(
    createRoute({ method: 'get', path: '/v1/pools/{name}', security, request: { params: NameParam }, responses: { 200: json(Pool, 'the pool: target, ready and starting per host, claims and misses per minute'), ...errors('not_found') } }),
    async (c) => c.json(await pools.get(c.get('principal'), c.req.valid('param').name), 200),
  );
  app.openapi(
    createRoute({ method: 'delete', path: '/v1/pools/{name}', security, request: { params: NameParam }, responses: { 204: { description: 'deleted; hosts destroy its ready sandboxes' }, ...errors('not_found') } }),
    async (c) => {
      await pools.delete(c.get('principal'), c.req.valid('param').name);
      return c.body(null, 204);
    },
  );
}

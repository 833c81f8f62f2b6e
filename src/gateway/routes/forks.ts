import { createRoute, z } from '@hono/zod-openapi';
import { ForkRequest, ForkResult, LayerDigest, SnapshotForkRequest } from '../../api/index.ts';
import type { ForkService } from '../fork-service.ts';
import { IdParam, errors, json, jsonBody, security, type GatewayApp } from './common.ts';

export type ForkApi = Pick<ForkService, 'forkSandbox' | 'forkSnapshot'>;

const IdempotencyHeader = z.object({ 'idempotency-key': z.string().regex(/^[A-Za-z0-9_.:-]{1,128}$/).optional() });
/** What a fork may answer when none of its children could be made (each child's own refusal is in the answer otherwise). */
const FORK_ERRORS = ['not_found', 'conflict', 'quota_exceeded', 'no_capacity', 'network_unavailable', 'admission_exhausted', 'timeout', 'node_lost'] as const;

/** Forks: N children from a sandbox's current state, or from a snapshot. */
export function registerForkRoutes(app: GatewayApp, forks: ForkApi): void {
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/fork',
      security,
      request: { params: IdParam, body: jsonBody(ForkRequest), headers: IdempotencyHeader },
      responses: {
        201: json(ForkResult, 'the children, in order, each running or refused with a coded error; the parent runs on'),
        200: json(ForkResult, 'replay of an earlier fork with the same Idempotency-Key (children in their states now)'),
        ...errors(...FORK_ERRORS, 'invalid_state'),
      },
    }),
    async (c) => {
      const { result, replayed } = await forks.forkSandbox(c.get('principal'), c.req.valid('param').id, c.req.valid('json'), c.req.valid('header')['idempotency-key']);
      return c.json(result, replayed ? 200 : 201);
    },
  );

  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/snapshots/{digest}/fork',
      security,
      request: { params: z.object({ digest: LayerDigest }), body: jsonBody(SnapshotForkRequest), headers: IdempotencyHeader },
      responses: {
        201: json(ForkResult, 'the children on the snapshot, in order, each running or refused with a coded error'),
        200: json(ForkResult, 'replay of an earlier fork with the same Idempotency-Key (children in their states now)'),
        ...errors(...FORK_ERRORS),
      },
    }),
    async (c) => {
      const { result, replayed } = await forks.forkSnapshot(c.get('principal'), c.req.valid('param').digest, c.req.valid('json'), c.req.valid('header')['idempotency-key']);
      return c.json(result, replayed ? 200 : 201);
    },
  );
}

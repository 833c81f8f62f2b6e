import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BurstPolicy, ERROR_CODES, RollboxError, type CommandStatus, type ErrorCode, type ExecResult, type ForkResult, type Layer, type Sandbox, type Scope } from '../api/index.ts';
import { createTokenIssuer, createTokenVerifier, type JwtConfig } from '../iam/index.ts';
import { createGateway, type GatewayDeps } from './app.ts';
import { createMetrics } from './metrics.ts';

/**
 * The gateway in process (`app.request`): real routing, zod validation, token checks and
 * error mapping, over in-memory stand-ins for its services (GatewayDeps' interfaces). Every
 * route answers once as it should, once without a token, and once with the error its
 * service throws (the code's status, the error body, Retry-After where the code has one).
 */

const NOW = 1_800_000_000_000;
const DIGEST = `sha256:${'a'.repeat(64)}`;
const SANDBOX: Sandbox = {
  id: 'sbx_1',
  tenant: 'team-a',
  state: 'running',
  node: 'node-1',
  spec: { image: { base: 'busybox', layers: [] }, resources: { cpuMillis: 1000, memoryMiB: 256, diskMiB: 1024, pids: 256 }, class: 'latency', network: { mode: 'none', allow: [] }, hiddenPaths: [], env: {}, workdir: '/', ttlSeconds: 3600, labels: {} },
  layerDigests: [DIGEST],
  createdAt: new Date(NOW).toISOString(),
  oomKills: 0,
};
const LAYER: Layer = { digest: DIGEST, name: 'busybox', sizeBytes: 1024, parents: [], createdAt: new Date(NOW).toISOString() };
const RESULT: ExecResult = { commandId: 'c1', exitCode: 0, stdout: 'hi\n', stderr: '', truncated: false, timedOut: false, oomKilled: false, durationMs: 1.5, replayed: false };
const STATUS: CommandStatus = { commandId: 'c1', argv: ['true'], state: 'running', node: 'node-1', queuedAt: new Date(NOW).toISOString(), stdout: '', stderr: '' };

/** Set by a test: the next service call throws this. */
let failure: RollboxError | undefined;
const answer = async <T>(value: T): Promise<T> => {
  const f = failure;
  failure = undefined;
  if (f) throw f;
  return value;
};

const FORK: ForkResult = {
  parent: 'sbx_1',
  parentKind: 'sandbox',
  forkLayer: DIGEST,
  forkedAt: SANDBOX.createdAt,
  parentFrozenMs: 12,
  processes: false,
  children: [{ id: 'sbx_c1', state: 'running' }, { error: { code: 'no_capacity', message: 'no room' } }],
  created: 1,
  refused: 1,
};

const entryAt = (path: string) => ({ name: path.split('/').pop()!, path, type: 'file' as const, sizeBytes: 1, mode: 0o644, permissions: '-rw-r--r--', owner: 'root', group: 'root', modifiedAt: '2026-01-01T00:00:00.000Z' });
const deps: Omit<GatewayDeps, 'verifier'> = {
  config: { http: { host: '127.0.0.1', port: 0, bodyLimitBytes: 4096, layerUploadLimitBytes: 1 << 20, layerBlobGzipLevel: 0, layerReads: { total: 4, perToken: 2, queueMs: 100, idleMs: 1000 } }, files: { maxBytes: 8192 }, runCodeLanguages: {} },
  redis: { ping: async () => 'PONG' },
  ttls: { setTtl: () => answer(SANDBOX) },
  sandboxes: {
    create: (_p, _r, key) => answer({ sandbox: SANDBOX, replayed: key === 'seen' }),
    list: () => answer([SANDBOX]),
    get: () => answer(SANDBOX),
    delete: () => answer({ ...SANDBOX, state: 'terminated' }),
    setPaused: (_p, _id, paused) => answer({ ...SANDBOX, state: paused ? 'paused' : 'running' }),
    setJobPaused: (_p, job) => answer({ job, results: [{ id: SANDBOX.id, outcome: 'done', state: 'paused' }] }),
    snapshot: () => answer(LAYER),
    setPolicy: () => answer(SANDBOX),
  },
  forks: {
    forkSandbox: (_p, id, r, key) => answer({ result: { ...FORK, parent: id, children: FORK.children.slice(0, r.count) }, replayed: key === 'seen' }),
    forkSnapshot: (_p, digest, r) => answer({ result: { ...FORK, parent: digest, parentKind: 'snapshot', children: FORK.children.slice(0, r.count) }, replayed: false }),
  },
  batches: {
    submit: () => answer(undefined as never),
    submitRollout: () => answer(undefined as never),
    submitNdjson: () => answer(undefined as never),
    get: () => answer(undefined as never),
    list: () => answer([]),
    cancel: () => answer(undefined as never),
    task: () => answer(undefined as never),
    results: () => answer(undefined as never),
    waitForLine: () => answer(undefined),
  },
  runs: { run: () => answer({ status: 'ok', exitCode: 0, stdout: '', stderr: '', truncated: false, oomKilled: false, durationMs: 1, totalMs: 2, files: {} }) },
  pools: {
    put: (_p, name, r) => answer({ ...r, name, layerDigests: [DIGEST], version: 'v1', createdAt: SANDBOX.createdAt, updatedAt: SANDBOX.createdAt, status: { target: 0, ready: 0, starting: 0, hosts: [], claimsPerMinute: 0, missesPerMinute: 0 } }),
    get: () => answer(undefined as never),
    list: () => answer([]),
    delete: () => answer(undefined),
  },
  execs: {
    exec: (_p, _id, _r, hop) => {
      hop?.('run', 1.5);
      return answer(RESULT);
    },
    async *streamExec() {
      await answer(undefined);
      yield { event: 'stdout', id: '1-0', data: 'hi\n' };
      yield { event: 'exit', id: 'exit', data: JSON.stringify({ exitCode: 0 }) };
    },
    startBackground: () => answer(STATUS),
    commandPage: () => answer({ commands: [STATUS] }),
    commandStatus: () => answer(STATUS),
    signalCommand: (_p, _id, commandId) => answer({ commandId, state: 'running' as const }),
    writeCommandStdin: (_p, _id, commandId) => answer({ commandId, state: 'running' as const }),
    resizeCommand: (_p, _id, commandId) => answer({ commandId, state: 'running' as const }),
    startPty: () => answer(STATUS),
    async *streamPty() {
      await answer(undefined);
      yield { event: 'stdout', id: '1-0', data: '$ ' };
    },
    async *followCommand() {
      await answer(undefined);
      yield { event: 'exit', id: 'exit', data: JSON.stringify({ exitCode: 0 }) };
    },
  },
  files: {
    read: () => answer({ body: Buffer.from('bytes'), tar: false }),
    write: (_p, _id, query, body) => answer({ path: query.path, kind: 'file' as const, sizeBytes: body.length }),
    stat: (_p, _id, path) => answer(entryAt(path)),
    list: (_p, _id, path) => answer([entryAt(`${path}/a`)]),
    makeDir: (_p, _id, path) => answer({ entry: entryAt(path), created: true }),
    move: (_p, _id, _source, destination) => answer(entryAt(destination)),
    remove: (_p, _id, path) => answer({ path, removed: true }),
  },
  layers: {
    register: (layer) => answer({ ...LAYER, ...layer }),
    list: () => answer([LAYER]),
    resolve: () => answer(LAYER),
    unname: () => answer({ ...LAYER, name: undefined }),
    publish: () => answer({ ...LAYER, published: true }),
    unpublish: () => answer({ ...LAYER, published: false }),
  },
  buildLayer: async () => answer({ digest: DIGEST, sizeBytes: 2048 }),
  layerStore: { locate: async () => undefined, chunkTable: async () => undefined },
  images: { records: { list: () => answer([]), record: () => answer(undefined as never), delete: () => answer(undefined as never), request: () => answer(undefined as never), publish: () => answer(undefined as never) }, checks: { start: () => answer(undefined as never), get: async () => undefined }, importImage: () => answer(undefined as never), syncedLayers: async () => new Set() },
  directory: { list: () => [] },
  metrics: createMetrics({ list: () => [] } as never),
  logger: pino({ level: 'silent' }),
  now: () => NOW,
  burst: {
    status: () => answer({ diverting: false, divertingSinceMs: null, utilization: 0.1, utilizationAtMs: NOW, policy: BurstPolicy.parse({}), syncedLayers: [], counts: { diverted: 0, local: 0, ineligible: 0, byReason: { not_diverting: 0, stay_local: 0, layers_not_synced: 0, share: 0, diverted: 0 } }, vmHours: 0, cloudHosts: [] }),
    setPolicy: (policy) => answer(policy),
  },
};

let dir: string;
let app: ReturnType<typeof createGateway>;
let token: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-gateway-'));
  const jwt: JwtConfig = { alg: 'HS256', secretFile: path.join(dir, 'jwt-secret'), issuer: 'rollbox', audience: 'rollbox-api', clockToleranceSec: 5 };
  const scopes: Scope[] = ['admin', 'sandbox:create', 'sandbox:read', 'sandbox:exec', 'sandbox:delete', 'sandbox:snapshot', 'sandbox:policy', 'layer:write', 'burst:admin'];
  token = await createTokenIssuer(jwt).issue({ tenant: 'team-a', scopes, ttlSeconds: 600 });
  app = createGateway({ ...deps, verifier: createTokenVerifier(jwt) });
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

interface Route {
  method: string;
  path: string;
  body?: unknown;
  headers?: Record<string, string>;
  status: number;
  /** A code the route's service may throw, and so answer. */
  fails: ErrorCode;
}

const json = (body: unknown) => ({ body: JSON.stringify(body), headers: { 'content-type': 'application/json' } });
const ROUTES: Route[] = [
  { method: 'POST', path: '/v1/sandboxes', body: { resources: { memoryMiB: 256 } }, status: 201, fails: 'quota_exceeded' },
  { method: 'POST', path: '/v1/sandboxes', body: {}, headers: { 'idempotency-key': 'seen' }, status: 200, fails: 'conflict' },
  { method: 'GET', path: '/v1/sandboxes?job=train-42', status: 200, fails: 'unavailable' },
  { method: 'GET', path: '/v1/sandboxes/sbx_1', status: 200, fails: 'not_found' },
  { method: 'DELETE', path: '/v1/sandboxes/sbx_1', status: 200, fails: 'timeout' },
  { method: 'POST', path: '/v1/sandboxes/sbx_1/exec', body: { argv: ['true'] }, status: 200, fails: 'result_unknown' },
  { method: 'POST', path: '/v1/sandboxes/sbx_1/exec', body: { cmd: 'sleep 9', background: true }, status: 202, fails: 'invalid_state' },
  { method: 'POST', path: '/v1/sandboxes/sbx_1/exec', body: { cmd: 'echo hi' }, headers: { accept: 'text/event-stream' }, status: 200, fails: 'invalid_state' },
  { method: 'GET', path: '/v1/sandboxes/sbx_1/commands?limit=10', status: 200, fails: 'not_found' },
  { method: 'GET', path: '/v1/sandboxes/sbx_1/commands/c1', status: 200, fails: 'not_found' },
  { method: 'POST', path: '/v1/sandboxes/sbx_1/pause', body: { mode: 'hibernate' }, status: 200, fails: 'invalid_state' },
  { method: 'POST', path: '/v1/sandboxes/sbx_1/resume', status: 200, fails: 'no_capacity' },
  { method: 'POST', path: '/v1/jobs/train-42/pause', status: 200, fails: 'internal' },
  { method: 'POST', path: '/v1/jobs/train-42/resume', status: 200, fails: 'internal' },
  { method: 'POST', path: '/v1/sandboxes/sbx_1/snapshot', body: { name: 'env-17' }, status: 201, fails: 'invalid_state' },
  { method: 'PATCH', path: '/v1/sandboxes/sbx_1/policy', body: { hiddenPaths: ['/grader'] }, status: 200, fails: 'conflict' },
  { method: 'POST', path: '/v1/sandboxes/sbx_1/fork', body: { count: 2, labels: { branch: 'a' } }, status: 201, fails: 'invalid_state' },
  { method: 'POST', path: '/v1/sandboxes/sbx_1/fork', body: { count: 1 }, headers: { 'idempotency-key': 'seen' }, status: 200, fails: 'quota_exceeded' },
  { method: 'POST', path: `/v1/snapshots/${DIGEST}/fork`, body: { count: 2, env: { A: '1' } }, status: 201, fails: 'not_found' },
  { method: 'GET', path: '/v1/sandboxes/sbx_1/files?path=/etc/hostname', status: 200, fails: 'payload_too_large' },
  { method: 'PUT', path: '/v1/sandboxes/sbx_1/files?path=/root/a', body: 'bytes', status: 200, fails: 'invalid_archive' },
  { method: 'POST', path: '/v1/layers?name=tools', body: 'tar bytes', status: 201, fails: 'invalid_layer' },
  { method: 'GET', path: '/v1/layers', status: 200, fails: 'unavailable' },
  { method: 'GET', path: '/v1/layers/busybox', status: 200, fails: 'not_found' },
  { method: 'DELETE', path: '/v1/layers/busybox', status: 200, fails: 'not_found' },
  { method: 'GET', path: '/v1/burst', status: 200, fails: 'unavailable' },
  { method: 'PUT', path: '/v1/burst/policy', body: { divertAboveUtilization: 0.9 }, status: 200, fails: 'invalid_request' },
];

async function call(route: Route, options: { token?: string } = {}): Promise<Response> {
  const body = route.body === undefined ? {} : typeof route.body === 'string' ? { body: route.body } : json(route.body);
  const headers = { ...('headers' in body ? body.headers : {}), ...route.headers, ...(options.token ? { authorization: `Bearer ${options.token}` } : {}) };
  return app.request(route.path, { method: route.method, body: 'body' in body ? body.body : undefined, headers });
}

describe('gateway routes, in process', () => {
  for (const route of ROUTES) {
    const name = `${route.method} ${route.path}${route.headers ? ` ${JSON.stringify(route.headers)}` : ''}`;
    it(`${name}: ${route.status}, 401 without a token, ${route.fails} from its service`, async () => {
      const ok = await call(route, { token });
      expect(ok.status, await ok.clone().text()).toBe(route.status);
      if (route.headers?.accept === 'text/event-stream') expect(await ok.text()).toContain('event: exit');

      const anonymous = await call(route);
      expect(anonymous.status).toBe(401);
      expect(((await anonymous.json()) as { error: { code: string } }).error.code).toBe('unauthenticated');

      failure = new RollboxError(route.fails, `made to fail: ${route.fails}`, route.fails === 'quota_exceeded' || route.fails === 'no_capacity' ? 7 : undefined);
      const failed = await call(route, { token });
      failure = undefined;
      expect(failed.status).toBe(ERROR_CODES[route.fails].status);
      expect(await failed.json()).toEqual({ error: { code: route.fails, message: `made to fail: ${route.fails}` } });
      if (route.fails === 'quota_exceeded' || route.fails === 'no_capacity') expect(failed.headers.get('retry-after')).toBe('7');
    });
  }

  it('validates bodies, queries and parameters with the schemas, naming the field', async () => {
    const cases: [Route, RegExp][] = [
      [{ method: 'POST', path: '/v1/sandboxes', body: { resources: { memoryMiB: -1 } }, status: 400, fails: 'internal' }, /body\.resources\.memoryMiB/],
      [{ method: 'POST', path: '/v1/sandboxes/sbx_1/exec', body: { argv: ['true'], cmd: 'true' }, status: 400, fails: 'internal' }, /exactly one of argv or cmd/],
      [{ method: 'POST', path: '/v1/sandboxes/sbx_1/exec', body: { cmd: 'pwd', cwd: '/proc/self/fd/3' }, status: 400, fails: 'internal' }, /cwd/],
      [{ method: 'GET', path: '/v1/sandboxes/sbx_1/commands?limit=0', status: 400, fails: 'internal' }, /query\.limit/],
      [{ method: 'POST', path: '/v1/layers?name=Not%20A%20Name', body: 'x', status: 400, fails: 'internal' }, /query\.name/],
      [{ method: 'PATCH', path: '/v1/sandboxes/sbx_1/policy', body: {}, status: 400, fails: 'internal' }, /network, hiddenPaths or both/],
      [{ method: 'POST', path: '/v1/sandboxes/sbx_1/fork', body: { count: 0 }, status: 400, fails: 'internal' }, /body\.count/],
      [{ method: 'POST', path: '/v1/sandboxes/sbx_1/fork', body: { count: 65 }, status: 400, fails: 'internal' }, /body\.count/],
      [{ method: 'POST', path: '/v1/sandboxes/sbx_1/fork', body: { count: 2, image: { base: 'busybox' } }, status: 400, fails: 'internal' }, /image/],
      [{ method: 'POST', path: '/v1/snapshots/not-a-digest/fork', body: { count: 2 }, status: 400, fails: 'internal' }, /digest/],
    ];
    for (const [route, message] of cases) {
      const r = await call(route, { token });
      const body = (await r.json()) as { error: { code: string; message: string } };
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(body.error.code).toBe('invalid_request');
      expect(body.error.message).toMatch(message);
    }
    // A JSON body sent as a form (busybox wget's default content type): 400, not an internal error.
    const form = await app.request('/v1/sandboxes/sbx_1/exec', { method: 'POST', body: '{"cmd":"true"}', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/x-www-form-urlencoded' } });
    expect(form.status).toBe(400);
    expect(await form.json()).toEqual({ error: { code: 'invalid_request', message: 'the body must be JSON (content-type: application/json)' } });
  });

  it('caps bodies (413 with Connection: close), answers 404 for unknown routes, and serves the operations endpoints', async () => {
    const big = await call({ method: 'POST', path: '/v1/sandboxes', body: { labels: { x: 'y'.repeat(5000) } }, status: 413, fails: 'internal' }, { token });
    expect(big.status).toBe(413);
    expect(big.headers.get('connection')).toBe('close');
    expect((await app.request('/v1/nope', { headers: { authorization: `Bearer ${token}` } })).status).toBe(404);
    expect((await app.request('/healthz')).status).toBe(200);
    expect(await (await app.request('/readyz')).json()).toMatchObject({ ready: true, redis: true });
    expect(await (await app.request('/metrics')).text()).toContain('rollbox_http_request_duration_seconds');
    const exec = await call(ROUTES.find((r) => r.path.endsWith('/exec'))!, { token });
    expect(exec.headers.get('server-timing')).toMatch(/auth;dur=[\d.]+.*run;dur=1\.5/);
  });

  it('documents every route with the error statuses of its codes, from the one table', async () => {
    const doc = (await (await app.request('/openapi.json')).json()) as { paths: Record<string, Record<string, { responses: Record<string, { description: string }> }>> };
    const exec = doc.paths['/v1/sandboxes/{id}/exec']!.post!.responses;
    expect(exec['409']!.description).toBe('invalid_state, result_unknown');
    expect(exec['401']!.description).toBe('unauthenticated');
    expect(Object.keys(doc.paths['/v1/sandboxes']!.post!.responses)).toEqual(expect.arrayContaining(['200', '201', '400', '401', '403', '404', '409', '413', '429', '500', '502', '503', '504']));
    for (const [route, methods] of Object.entries(doc.paths)) for (const [method, op] of Object.entries(methods)) expect(op.responses['401'], `${method} ${route}`).toBeDefined();
  });
});

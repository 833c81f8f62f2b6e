import { Readable } from 'node:stream';
import { createRoute, z } from '@hono/zod-openapi';
import { streamSSE } from 'hono/streaming';
import { Batch, BatchEventsQuery, BatchList, BatchOptions, BatchResultsQuery, BatchSubmitQuery, BatchTaskStatus, CreateBatchRequest, RollboxError, type BatchResultLine, type FollowedRollout } from '../../api/index.ts';
import type { RolloutService } from '../../rollouts/index.ts';
import { isTerminalBatch, type BatchService } from '../batches/index.ts';
import { describeZodError } from '../errors.ts';
import { IdParam, errors, json, jsonBody, security, type GatewayApp } from './common.ts';

export type BatchApi = Pick<BatchService, 'submit' | 'submitRollout' | 'submitNdjson' | 'get' | 'list' | 'cancel' | 'task' | 'results' | 'waitForLine'>;

export const NDJSON = 'application/x-ndjson';
/** How long an SSE follower's read blocks before a keep-alive comment. */
const EVENTS_BLOCK_MS = 15_000;

/** Evaluation batches (scope batch:submit): submit, read, list, cancel, follow results. */
export function registerBatchRoutes(app: GatewayApp, batches: BatchApi, rollouts?: Pick<RolloutService, 'trajectory'>): void {
  // JSON ({"tasks": [...]} with the options) or NDJSON (a task per line, options in the
  // query), streamed: outside the OpenAPI routes so the body is read as it comes.
  app.post('/v1/batches', async (c) => {
    const principal = c.get('principal');
    if ((c.req.header('content-type') ?? '').startsWith(NDJSON)) {
      const query = BatchSubmitQuery.safeParse(c.req.query());
      if (!query.success) throw new RollboxError('invalid_request', describeZodError(query.error, 'query'));
      const { metadata, ...rest } = query.data;
      let parsedMetadata: unknown;
      try {
        parsedMetadata = metadata ? JSON.parse(metadata) : {};
      } catch {
        throw new RollboxError('invalid_request', 'query.metadata: not JSON');
      }
      const options = BatchOptions.safeParse({ ...rest, metadata: parsedMetadata });
      if (!options.success) throw new RollboxError('invalid_request', describeZodError(options.error, 'query'));
      if (!c.req.raw.body) throw new RollboxError('invalid_request', 'body: NDJSON tasks are required');
      return c.json(await batches.submitNdjson(principal, options.data, Readable.fromWeb(c.req.raw.body as never)), 201);
    }
    const body: unknown = await c.req.json().catch(() => {
      throw new RollboxError('invalid_request', 'body: not JSON (send application/json, or application/x-ndjson with one task per line)');
    });
    const request = CreateBatchRequest.safeParse(body);
    if (!request.success) throw new RollboxError('invalid_request', describeZodError(request.error, 'body'));
    return c.json(await batches.submit(principal, request.data), 201);
  });
  app.openAPIRegistry.registerPath({
    method: 'post',
    path: '/v1/batches',
    security,
    description: `A batch of tasks: JSON (the options and "tasks"), or ${NDJSON} (one task per line, the options in the query), streamed.`,
    request: { query: BatchSubmitQuery, body: jsonBody(CreateBatchRequest) },
    responses: { 201: json(Batch, 'the batch, in_progress (or failed: its input was refused)'), ...errors('invalid_request', 'payload_too_large') },
  });

  app.openapi(
    createRoute({ method: 'get', path: '/v1/batches', security, request: { query: z.object({ limit: z.coerce.number().int().min(1).max(1000).default(100) }) }, responses: { 200: json(BatchList, "the tenant's batches, newest first"), ...errors() } }),
    async (c) => c.json({ batches: await batches.list(c.get('principal'), c.req.valid('query').limit) }, 200),
  );
  app.openapi(
    createRoute({ method: 'get', path: '/v1/batches/{id}', security, request: { params: IdParam }, responses: { 200: json(Batch, 'state, a timestamp per state, counts'), ...errors('not_found') } }),
    async (c) => c.json(await batches.get(c.get('principal'), c.req.valid('param').id), 200),
  );
  app.openapi(
    createRoute({ method: 'post', path: '/v1/batches/{id}/cancel', security, request: { params: IdParam }, responses: { 200: json(Batch, 'cancelling (tasks still running end soon) or cancelled; results already produced stay'), ...errors('not_found') } }),
    async (c) => c.json(await batches.cancel(c.get('principal'), c.req.valid('param').id), 200),
  );
  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/batches/{id}/tasks/{customId}',
      security,
      request: { params: z.object({ id: z.string().max(64), customId: z.string().max(128) }) },
      responses: { 200: json(BatchTaskStatus, 'queued (with its position), running, or done (with its status)'), ...errors('not_found') },
    }),
    async (c) => {
      const { id, customId } = c.req.valid('param');
      return c.json(await batches.task(c.get('principal'), id, customId), 200);
    },
  );

  // NDJSON, one line per ended task; X-Rollbox-Cursor is where to resume (?after=).
  app.get('/v1/batches/:id/results', async (c) => {
    const query = BatchResultsQuery.safeParse(c.req.query());
    if (!query.success) throw new RollboxError('invalid_request', describeZodError(query.error, 'query'));
    const { after, limit, waitSeconds } = query.data;
    const { lines, batch } = await batches.results(c.get('principal'), c.req.param('id'), after, limit, waitSeconds * 1000);
    const cursor = lines.at(-1)?.cursor ?? after ?? '';
    const body = lines.map((l) => JSON.stringify(l)).join('\n') + (lines.length ? '\n' : '');
    return c.body(body, 200, { 'content-type': NDJSON, 'x-rollbox-cursor': cursor, 'x-rollbox-batch-state': batch.state });
  });
  app.openAPIRegistry.registerPath({
    method: 'get',
    path: '/v1/batches/{id}/results',
    security,
    description: 'NDJSON: one line per ended task (BatchResultLine), oldest first; resume with ?after=<cursor> (the last line\'s, also in X-Rollbox-Cursor); waitSeconds long-polls.',
    request: { params: IdParam, query: BatchResultsQuery },
    responses: { 200: { description: 'result lines', content: { [NDJSON]: { schema: z.string() } } }, ...errors('not_found') },
  });

  // Server-sent events: `result` (a line; its id is the cursor) or, with ?trajectory=true,
  // `rollout` (the line with its rollout's trajectory), `progress` (the batch), then `end`.
  app.get('/v1/batches/:id/events', async (c) => {
    const principal = c.get('principal');
    const id = c.req.param('id');
    const query = BatchEventsQuery.safeParse(c.req.query());
    if (!query.success) throw new RollboxError('invalid_request', describeZodError(query.error, 'query'));
    if (query.data.trajectory && !rollouts) throw new RollboxError('invalid_request', 'query.trajectory: this gateway does not host rollouts');
    let after = c.req.header('last-event-id') || query.data.after;
    const first = await batches.results(principal, id, after, 500, 0);
    // A rollout is sent once its trajectory is read: a follower that drops before it resumes from the cursor before it.
    const eventOf = async (line: BatchResultLine) => {
      if (!query.data.trajectory) return { event: 'result', id: line.cursor, data: JSON.stringify(line) };
      const followed: FollowedRollout = { line, ...(line.rollout ? { trajectory: await rollouts!.trajectory(principal, line.rollout.id) } : {}) };
      return { event: 'rollout', id: line.cursor, data: JSON.stringify(followed) };
    };
    return streamSSE(c, async (sse) => {
      let page = first;
      let lastCounts = '';
      for (;;) {
        for (const line of page.lines) await sse.writeSSE(await eventOf(line));
        after = page.lines.at(-1)?.cursor ?? after;
        const counts = JSON.stringify(page.batch.counts) + page.batch.state;
        if (counts !== lastCounts) await sse.writeSSE({ event: 'progress', data: JSON.stringify(page.batch) });
        lastCounts = counts;
        if (page.lines.length === 0 && isTerminalBatch(page.batch)) {
          await sse.writeSSE({ event: 'end', data: JSON.stringify(page.batch) });
          return;
        }
        if (page.lines.length === 0) await sse.write(': waiting\n\n');
        page = await batches.results(principal, id, after, 500, page.lines.length === 0 ? EVENTS_BLOCK_MS : 0);
        if (sse.aborted || sse.closed) return;
      }
    });
  });
  app.openAPIRegistry.registerPath({
    method: 'get',
    path: '/v1/batches/{id}/events',
    security,
    description:
      'Server-sent events: `result` (a BatchResultLine; the event id is its cursor) per ended task, or with trajectory=true `rollout` (a FollowedRollout: the line and its rollout\'s trajectory); `progress` (the Batch) when its counts change; `end` (the Batch) once it has ended and every line was sent. Resume with Last-Event-ID (or ?after=): each line is sent once across reconnects.',
    request: { params: IdParam, query: z.object({ after: BatchResultsQuery.shape.after, trajectory: z.enum(['true', 'false']).optional() }) },
    responses: { 200: { description: 'event stream', content: { 'text/event-stream': { schema: z.string() } } }, ...errors('not_found', 'invalid_request') },
  });
}

import { createRoute, z } from '@hono/zod-openapi';
import { streamSSE } from 'hono/streaming';
import { setMetric } from 'hono/timing';
import { CommandInputResult, CommandList, CommandSignalRequest, CommandStatus, CommandStdinRequest, ExecRequest, ExecResult, ListCommandsQuery, RollboxError } from '../../api/index.ts';
import type { ExecService } from '../exec-service.ts';
import { IdParam, errors, json, jsonBody, security, type GatewayApp } from './common.ts';

/** What the command routes need of the exec service. */
export type ExecApi = Pick<ExecService, 'exec' | 'streamExec' | 'startBackground' | 'commandPage' | 'commandStatus' | 'signalCommand' | 'writeCommandStdin'>;

/** Commands: exec (buffered, streamed as server-sent events, or in the background), the command log. */
export function registerCommandRoutes(app: GatewayApp, execs: ExecApi): void {
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/exec',
      security,
      request: { params: IdParam, body: jsonBody(ExecRequest) },
      responses: {
        200: json(ExecResult, 'the command finished (or timed out); with Accept: text/event-stream, its output as server-sent events'),
        202: json(CommandStatus, 'background: the command was started'),
        ...errors('not_found', 'invalid_state', 'result_unknown', 'payload_too_large', 'timeout'),
      },
    }),
    async (c) => {
      const { id } = c.req.valid('param');
      const request = c.req.valid('json');
      if (request.background) return c.json(await execs.startBackground(c.get('principal'), id, request), 202);
      if (!c.req.header('accept')?.includes('text/event-stream')) return c.json(await execs.exec(c.get('principal'), id, request, (hop, ms) => setMetric(c, hop, ms)), 200);
      // Streaming: errors before the first event still answer as JSON with their status.
      const events = execs.streamExec(c.get('principal'), id, request, c.req.header('last-event-id') || '0');
      const first = await events.next();
      return streamSSE(c, async (sse) => {
        try {
          for (let next = first; !next.done; next = await events.next()) await sse.writeSSE(next.value);
        } catch (err) {
          const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: 'internal error' };
          await sse.writeSSE({ event: 'error', data: JSON.stringify({ error }) });
        }
      }) as never; // an SSE response, outside the JSON response types of the route
    },
  );

  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/sandboxes/{id}/commands',
      security,
      request: { params: IdParam, query: ListCommandsQuery },
      responses: { 200: json(CommandList, 'the command log (trajectory), oldest first, a page at a time (`nextCursor`)'), ...errors('not_found') },
    }),
    async (c) => {
      const { limit, after } = c.req.valid('query');
      return c.json(await execs.commandPage(c.get('principal'), c.req.valid('param').id, after === undefined ? { limit } : { limit, after }), 200);
    },
  );

  app.openapi(
    createRoute({
      method: 'get',
      path: '/v1/sandboxes/{id}/commands/{commandId}',
      security,
      request: { params: z.object({ id: z.string().max(64), commandId: z.string().max(128) }) },
      responses: { 200: json(CommandStatus, 'a command (e.g. a background one): state, result, output so far'), ...errors('not_found') },
    }),
    async (c) => c.json(await execs.commandStatus(c.get('principal'), c.req.valid('param').id, c.req.valid('param').commandId), 200),
  );

  const CommandParams = z.object({ id: z.string().max(64), commandId: z.string().max(128) });
  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/commands/{commandId}/signal',
      security,
      request: { params: CommandParams, body: jsonBody(CommandSignalRequest) },
      responses: { 200: json(CommandInputResult, "the signal was sent to the running command's process group"), ...errors('not_found', 'invalid_state') },
    }),
    async (c) => {
      const { id, commandId } = c.req.valid('param');
      return c.json(await execs.signalCommand(c.get('principal'), id, commandId, c.req.valid('json').signal), 200);
    },
  );

  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/commands/{commandId}/stdin',
      security,
      request: { params: CommandParams, body: jsonBody(CommandStdinRequest) },
      responses: { 200: json(CommandInputResult, 'the bytes went to the running command (started with stdinOpen)'), ...errors('not_found', 'invalid_state', 'payload_too_large') },
    }),
    async (c) => {
      const { id, commandId } = c.req.valid('param');
      return c.json(await execs.writeCommandStdin(c.get('principal'), id, commandId, c.req.valid('json')), 200);
    },
  );
}

import { createRoute, z } from '@hono/zod-openapi';
import { streamSSE } from 'hono/streaming';
import { setMetric } from 'hono/timing';
import type { Context } from 'hono';
import { CommandInputResult, CommandList, CommandResizeRequest, CommandSignalRequest, CommandStatus, CommandStdinRequest, ExecRequest, ExecResult, ListCommandsQuery, PtyRequest, RollboxError, DEFAULT_BACKGROUND_TIMEOUT_MS } from '../../api/index.ts';
import type { ExecEvent, ExecService } from '../exec-service.ts';
import { IdParam, errors, json, jsonBody, security, type GatewayApp } from './common.ts';

/** What the command routes need of the exec service. */
export type ExecApi = Pick<ExecService, 'exec' | 'streamExec' | 'startBackground' | 'commandPage' | 'commandStatus' | 'signalCommand' | 'writeCommandStdin' | 'startPty' | 'streamPty' | 'resizeCommand' | 'followCommand'>;

const wantsEvents = (c: Context): boolean => c.req.header('accept')?.includes('text/event-stream') === true;

/**
 * A command's events as server-sent events; errors before the first event still answer as
 * JSON with their status. A terminal's output goes as `pty` events whose data is a JSON
 * string: SSE takes CR and LF as line ends, and a terminal's carriage returns must survive.
 */
async function sseOf(c: Context, events: AsyncGenerator<ExecEvent>, pty = false): Promise<never> {
  const first = await events.next();
  const encode = (ev: ExecEvent) => (pty && ev.event !== 'exit' ? { event: 'pty', id: ev.id, data: JSON.stringify(ev.data) } : ev);
  return streamSSE(c, async (sse) => {
    try {
      for (let next = first; !next.done; next = await events.next()) await sse.writeSSE(encode(next.value));
    } catch (err) {
      const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: 'internal error' };
      await sse.writeSSE({ event: 'error', data: JSON.stringify({ error }) });
    }
  }) as never; // an SSE response, outside the JSON response types of the route
}

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
      if (!wantsEvents(c)) return c.json(await execs.exec(c.get('principal'), id, request, (hop, ms) => setMetric(c, hop, ms)), 200);
      return sseOf(c, execs.streamExec(c.get('principal'), id, request, c.req.header('last-event-id') || '0'));
    },
  );

  app.openapi(
    createRoute({
      method: 'post',
      path: '/v1/sandboxes/{id}/pty',
      security,
      request: { params: IdParam, body: jsonBody(PtyRequest) },
      responses: {
        202: json(CommandStatus, 'the command was started on a terminal (or found by its commandId); with Accept: text/event-stream, its output as server-sent events (`pty`, each a JSON string of terminal output, then `exit`)'),
        ...errors('not_found', 'invalid_state', 'tier_unsupported'),
      },
    }),
    async (c) => {
      const { id } = c.req.valid('param');
      const request = c.req.valid('json');
      if (!wantsEvents(c)) return c.json(await execs.startPty(c.get('principal'), id, request), 202);
      return sseOf(c, execs.streamPty(c.get('principal'), id, request, c.req.header('last-event-id') || '0'), true);
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
      responses: {
        200: json(CommandStatus, 'a command (e.g. a background one): state, result, output so far; with Accept: text/event-stream, its output from the start (or after Last-Event-ID) as it comes (a pty command as `pty` events, JSON strings), then `exit`'),
        ...errors('not_found'),
      },
    }),
    async (c) => {
      const { id, commandId } = c.req.valid('param');
      const status = await execs.commandStatus(c.get('principal'), id, commandId);
      if (!wantsEvents(c)) return c.json(status, 200);
      // Followed for as long as it may still run (a background or pty command: a day).
      return sseOf(c, execs.followCommand(c.get('principal'), id, commandId, { lastEventId: c.req.header('last-event-id') || '0', timeoutMs: DEFAULT_BACKGROUND_TIMEOUT_MS }), status.pty !== undefined);
    },
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
      path: '/v1/sandboxes/{id}/commands/{commandId}/resize',
      security,
      request: { params: CommandParams, body: jsonBody(CommandResizeRequest) },
      responses: { 200: json(CommandInputResult, "the running pty command's terminal has the new size (its foreground process group got SIGWINCH)"), ...errors('not_found', 'invalid_state') },
    }),
    async (c) => {
      const { id, commandId } = c.req.valid('param');
      return c.json(await execs.resizeCommand(c.get('principal'), id, commandId, c.req.valid('json')), 200);
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

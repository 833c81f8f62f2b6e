import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { HonoAdapter } from '@bull-board/hono';
import { serveStatic } from '@hono/node-server/serve-static';
import type { Queue } from 'bullmq';
import type { MiddlewareHandler } from 'hono';
import { requireScope, type TokenVerifier } from '../../iam/index.ts';
import type { GatewayApp } from '../routes/common.ts';

export const QUEUE_BOARD_PATH = '/ui/queues';
/** The queue list is read again at most this often (nodes and batches come and go). */
const REFRESH_MS = 2000;

export interface QueueBoardDeps {
  verifier: TokenVerifier;
  /** Every BullMQ queue an operator may look at now (each node's creates, each batch's tasks). */
  queues: () => Queue[];
}

/**
 * bull-board over rollbox's BullMQ queues, for operators (admin scope). Read-only: a job
 * removed or cleaned from a page would be accepted work silently lost. A browser is asked
 * for Basic credentials (any user name, the token as password); a Bearer header works too.
 */
export function registerQueueBoard(app: GatewayApp, deps: QueueBoardDeps): void {
  const serverAdapter = new HonoAdapter(serveStatic);
  serverAdapter.setBasePath(QUEUE_BOARD_PATH);
  const board = createBullBoard({ queues: [], serverAdapter, options: { uiConfig: { boardTitle: 'rollbox queues' } } });
  let refreshedAtMs = 0;
  const refresh: MiddlewareHandler = async (_c, next) => {
    if (Date.now() - refreshedAtMs > REFRESH_MS) {
      refreshedAtMs = Date.now();
      board.replaceQueues(deps.queues().map((q) => new BullMQAdapter(q, { readOnlyMode: true })));
    }
    await next();
  };
  for (const p of [QUEUE_BOARD_PATH, `${QUEUE_BOARD_PATH}/*`]) app.use(p, adminOnly(deps.verifier), securityHeaders, refresh);
  app.route(QUEUE_BOARD_PATH, serverAdapter.registerPlugin());
}

function adminOnly(verifier: TokenVerifier): MiddlewareHandler {
  return async (c, next) => {
    const header = c.req.header('authorization');
    const basic = header?.match(/^Basic\s+(\S+)$/i)?.[1];
    const bearer = basic ? `Bearer ${Buffer.from(basic, 'base64').toString('utf8').split(':').slice(1).join(':')}` : header;
    try {
      requireScope(await verifier.verify(bearer), 'admin');
    } catch (err) {
      const status = header ? 403 : 401;
      return c.text(`${err instanceof Error ? err.message : String(err)}: the queue view needs an admin token (Basic auth: any user, the token as password)`, status, { 'www-authenticate': 'Basic realm="rollbox queues"' });
    }
    await next();
  };
}

/** Its own scripts and styles only (bull-board's inline loading styles allowed), nothing framed, nothing sent elsewhere. */
const securityHeaders: MiddlewareHandler = async (c, next) => {
  await next();
  c.header('content-security-policy', "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'self'; form-action 'none'; frame-ancestors 'none'");
  c.header('referrer-policy', 'no-referrer');
  c.header('x-content-type-options', 'nosniff');
};


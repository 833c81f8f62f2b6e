import type { RedisWaitState } from '../redis/index.ts';

/** What a gateway still waiting for Redis answers (see startGatewayRole). */
export function startingAnswer(request: Request, waiting: RedisWaitState | undefined): Response {
  const reason = waiting ? `waiting for Redis (${waiting.reason}${waiting.error ? `: ${waiting.error}` : ''})` : 'starting';
  const path = new URL(request.url).pathname;
  if (path === '/healthz') return Response.json({ ok: true, starting: true, reason });
  if (path === '/readyz') return Response.json({ ready: false, redis: false, reason }, { status: 503 });
  return Response.json({ error: { code: 'unavailable', message: `the gateway is starting: ${reason}` } }, { status: 503, headers: { 'retry-after': '1' } });
}


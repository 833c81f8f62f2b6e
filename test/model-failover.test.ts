import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutKeyStore } from '../src/iam/index.ts';
import { ModelCallLog } from '../src/model-gateway/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { ScriptedUpstream, type ScriptTurn } from './support/model-upstream.ts';
import { startTcpFailover } from './support/tcp-failover.ts';

// Model calls survive their gateway: a retry that lands on another gateway joins the call
// there (read from Redis), and a gateway SIGKILLed mid-call has its call taken over by the
// gateway the SDK's retry reaches, which re-issues it: recorded once.
const SCRIPT: ScriptTurn[] = [{ text: 'Running the tests now.', toolCalls: [{ name: 'bash', arguments: { cmd: 'pytest -q' } }] }, { text: 'Done.' }];
let cluster: TestCluster;
let redis: Redis;
let log: ModelCallLog;
let keys: RolloutKeyStore;
let upstream: ScriptedUpstream;
let gatewayA: { child: import('node:child_process').ChildProcess; url: string };
let gatewayB: { child: import('node:child_process').ChildProcess; url: string };

beforeAll(async () => {
  cluster = await startTestCluster({ env: { ROLLBOX_MODEL_LEASE_MS: '1000', ROLLBOX_MODEL_PROBE_MS: '200' } });
  redis = new Redis(cluster.redisUrl);
  log = new ModelCallLog(redis);
  keys = new RolloutKeyStore(redis);
  upstream = await ScriptedUpstream.start({ script: SCRIPT });
  [gatewayA, gatewayB] = await Promise.all([cluster.spawnGateway({ name: 'gw-a' }), cluster.spawnGateway({ name: 'gw-b' })]);
  const trainer = await cluster.token('team-fo', ['rollout:submit']);
  expect((await api(cluster, trainer, 'PUT', '/v1/jobs/job-fo/model', { upstreams: [{ baseUrl: upstream.url }] })).status).toBe(200);
});
afterAll(async () => {
  await upstream?.stop();
  redis?.disconnect();
  await cluster?.stop();
});

const hostPort = (url: string) => ({ host: new URL(url).hostname, port: Number(new URL(url).port) });
const post = (base: string, key: string, body: unknown, headers: Record<string, string> = {}) => fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });

describe('model calls across gateways', () => {
  it('joins a retry that lands on another gateway to the call in flight there', async () => {
    const key = await keys.issue({ tenant: 'team-fo', rolloutId: 'ro-join', job: 'job-fo', ttlSeconds: 600 });
    upstream.delayMs = 1500;
    const before = upstream.count('/v1/chat/completions');
    const body = { model: 'm', messages: [{ role: 'user', content: 'join me' }], stream: true };
    const first = post(gatewayA.url, key, body).then((r) => r.text());
    await waitFor('the call upstream', async () => upstream.count('/v1/chat/completions') > before);
    const retry = await post(gatewayB.url, key, body, { 'x-stainless-retry-count': '1' }).then((r) => r.text());
    upstream.delayMs = 0;
    expect(retry).toBe(await first);
    expect(retry).toContain('Running the tests now.'.slice(0, 4));
    expect(retry.trim().endsWith('data: [DONE]')).toBe(true);
    expect(upstream.count('/v1/chat/completions') - before).toBe(1);
    const [call] = (await log.list('ro-join')).calls;
    expect(call).toMatchObject({ retriesJoined: 1, attempts: [{ outcome: 'ok' }] });
  });

  it('takes over the call of a gateway SIGKILLed mid-call, through the SDK\'s retry: recorded once', async () => {
    const key = await keys.issue({ tenant: 'team-fo', rolloutId: 'ro-kill', job: 'job-fo', ttlSeconds: 600 });
    const front = await startTcpFailover(() => [hostPort(gatewayA.url), hostPort(gatewayB.url)]);
    try {
      const client = new OpenAI({ apiKey: key, baseURL: `${front.url}/v1`, timeout: 30_000, maxRetries: 3 });
      upstream.delayMs = 2500;
      const before = upstream.count('/v1/chat/completions');
      const answer = client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'survive' }] });
      await waitFor('the call upstream', async () => upstream.count('/v1/chat/completions') > before);
      gatewayA.child.kill('SIGKILL');
      const result = await answer;
      upstream.delayMs = 0;
      expect(result.choices[0]!.message.content).toBe(SCRIPT[0]!.text);
      expect(result.choices[0]!.message.tool_calls![0]).toMatchObject({ function: { arguments: JSON.stringify({ cmd: 'pytest -q' }) } });
      // The dead gateway's request, and the re-issue of the gateway that took the call over.
      expect(upstream.count('/v1/chat/completions') - before).toBe(2);
      const calls = (await log.list('ro-kill')).calls;
      expect(calls).toHaveLength(1);
      expect(calls[0]!.attempts.map((a) => a.outcome)).toEqual(['owner_lost', 'ok']);
      expect(calls[0]!.retriesJoined).toBeGreaterThanOrEqual(1);
      // The agent's next turn goes through the gateway left.
      const next = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'survive' }, result.choices[0]!.message, { role: 'tool', tool_call_id: result.choices[0]!.message.tool_calls![0]!.id, content: 'ok' }] });
      expect(next.choices[0]!.message.content).toBe(SCRIPT[1]!.text);
      expect((await log.list('ro-kill')).calls.map((c) => c.turn)).toEqual([1, 2]);
    } finally {
      await front.close();
    }
  });

  it('answers and records a call whose Redis restarted while it was upstream (nothing acknowledged is lost)', async () => {
    const key = await keys.issue({ tenant: 'team-fo', rolloutId: 'ro-redis', job: 'job-fo', ttlSeconds: 600 });
    // The answer comes while Redis is down (a restart takes longer than this): its record waits for Redis.
    upstream.delayMs = 300;
    const before = upstream.count('/v1/chat/completions');
    const answer = new OpenAI({ apiKey: key, baseURL: `${cluster.url}/v1`, timeout: 60_000, maxRetries: 0 }).chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'through a failover' }] });
    await waitFor('the call upstream', async () => upstream.count('/v1/chat/completions') > before);
    await cluster.restartRedis();
    const result = await answer;
    upstream.delayMs = 0;
    expect(result.choices[0]!.message.content).toBe(SCRIPT[0]!.text);
    const fresh = new Redis(cluster.redisUrl);
    try {
      const calls = (await new ModelCallLog(fresh).list('ro-redis')).calls;
      expect(calls.map((c) => [c.turn, c.outcome])).toEqual([[1, 'ok']]);
    } finally {
      fresh.disconnect();
    }
    expect(upstream.count('/v1/chat/completions') - before).toBe(1);
  });
});

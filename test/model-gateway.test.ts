import Anthropic from '@anthropic-ai/sdk';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RolloutKeyStore } from '../src/iam/index.ts';
import { ModelCallLog } from '../src/model-gateway/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';
import { chatTurn, idsOf } from './support/model-script.ts';
import { ScriptedUpstream, type ScriptTurn } from './support/model-upstream.ts';

// The model gateway with the official SDKs: calls relayed and recorded as the script says,
// streams assembled, token fields injected for the trainer and kept from the agent, errors
// in each SDK's shape, and the walls (other rollouts, the upstream's credentials).
const SECRET = 'sk-upstream-secret-0123456789';
const SCRIPT: ScriptTurn[] = [
  { text: 'Let me look.', toolCalls: [{ name: 'bash', arguments: { cmd: 'ls -la /workspace' } }] },
  { toolCalls: [{ name: 'bash', arguments: { cmd: 'cat README.md' } }, { name: 'bash', arguments: { cmd: 'echo done' } }] },
  { text: 'The task is finished: all tests pass.' },
];
let cluster: TestCluster;
let redis: Redis;
let keys: RolloutKeyStore;
let log: ModelCallLog;
let upstream: ScriptedUpstream;
let trainer: string;

beforeAll(async () => {
  cluster = await startTestCluster();
  redis = new Redis(cluster.redisUrl);
  keys = new RolloutKeyStore(redis);
  log = new ModelCallLog(redis);
  upstream = await ScriptedUpstream.start({ script: SCRIPT });
  trainer = await cluster.token('team-mg', ['rollout:submit']);
  const put = await api(cluster, trainer, 'PUT', '/v1/jobs/job-mg/model', { upstreams: [{ baseUrl: upstream.url }], headers: { authorization: `Bearer ${SECRET}` }, tokenFields: { returnTokenIds: true, logprobs: true } });
  expect(put.status).toBe(200);
  expect(JSON.stringify(put.body)).not.toContain(SECRET);
  expect(put.body.binding.headers).toEqual(['authorization']);
});
afterAll(async () => {
  await upstream?.stop();
  redis?.disconnect();
  await cluster?.stop();
});

const rollout = async (id: string, job = 'job-mg') => keys.issue({ tenant: 'team-mg', rolloutId: id, job, ttlSeconds: 600 });
const openai = (key: string, id: string) => new OpenAI({ apiKey: key, baseURL: `${cluster.url}/v1/rollouts/${id}/model/v1`, maxRetries: 0 });
const anthropic = (key: string, id: string) => new Anthropic({ apiKey: key, baseURL: `${cluster.url}/v1/rollouts/${id}/model`, maxRetries: 0 });
const records = async (id: string) => (await log.list(id)).calls.sort((a, b) => a.turn - b.turn);


describe('model gateway', () => {
  it('relays an OpenAI chat agent (plain and streamed turns) and records each call as the script says, token fields for the trainer only', async () => {
    const key = await rollout('ro-chat');
    const client = openai(key, 'ro-chat');
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'Fix the bug.' }];
    const first = await client.chat.completions.create({ model: 'm', messages });
    expect(first.choices[0]!.message.tool_calls![0]).toMatchObject({ function: { name: 'bash', arguments: JSON.stringify({ cmd: 'ls -la /workspace' }) } });
    // The agent asked for neither: they are the trainer's.
    expect(first).not.toHaveProperty('prompt_token_ids');
    expect(first.choices[0]).not.toHaveProperty('token_ids');
    expect(first.choices[0]!.logprobs).toBeNull();
    messages.push(first.choices[0]!.message, { role: 'tool', tool_call_id: first.choices[0]!.message.tool_calls![0]!.id, content: 'README.md' });
    const stream = await client.chat.completions.create({ model: 'm', messages, stream: true });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.length).toBeGreaterThan(5);
    for (const chunk of chunks) {
      expect(chunk).not.toHaveProperty('usage');
      expect(chunk).not.toHaveProperty('prompt_token_ids');
      expect(chunk.choices[0]).not.toHaveProperty('token_ids');
    }
    expect(chunks.every((c) => c.choices.length === 1)).toBe(true);
    const args = chunks.flatMap((c) => c.choices[0]!.delta.tool_calls ?? []).filter((t) => t.index === 1).map((t) => t.function?.arguments ?? '').join('');
    expect(JSON.parse(args)).toEqual({ cmd: 'echo done' });

    const calls = await records('ro-chat');
    expect(calls.map((c) => [c.turn, c.api, c.stream, c.outcome])).toEqual([[1, 'chat.completions', false, 'ok'], [2, 'chat.completions', true, 'ok']]);
    expect(calls.map(chatTurn)).toEqual(SCRIPT.slice(0, 2));
    expect(calls[1]!.finishReason).toBe('tool_calls');
    for (const [i, call] of calls.entries()) {
      expect(call.request).toMatchObject({ return_token_ids: true, logprobs: true });
      const step = SCRIPT[i]!;
      const generated = (step.text ?? '') + (step.toolCalls ?? []).map((t) => JSON.stringify(t.arguments)).join('');
      expect(call.tokens!.choices[0]!.tokenIds).toEqual(idsOf(generated));
      expect(call.tokens!.choices[0]!.logprobs).toHaveLength([...generated].length);
      expect(call.tokens!.promptTokenIds!.length).toBeGreaterThan(0);
      expect(call.usage!.completionTokens).toBeGreaterThan(0);
      expect(call.upstream).toBe(upstream.url);
      expect(call.retriesJoined).toBe(0);
    }
    // The upstream got the trainer's credentials; no answer or record shows them.
    const received = upstream.received.filter((r) => r.path === '/v1/chat/completions').slice(-2);
    expect(received.map((r) => r.headers.authorization)).toEqual([`Bearer ${SECRET}`, `Bearer ${SECRET}`]);
    expect(received.every((r) => r.headers['x-api-key'] === undefined && !JSON.stringify(r.headers).includes(key))).toBe(true);
    expect(JSON.stringify(calls)).not.toContain(SECRET);
  });

  it('gives an agent the token fields it asked for itself', async () => {
    const key = await rollout('ro-asks');
    const res = await api({ url: `${cluster.url}/v1` }, key, 'POST', '/completions', { model: 'm', prompt: 'Say hi', return_token_ids: true, logprobs: 0, stream: false });
    expect(res.status).toBe(200);
    expect(res.body.choices[0].token_ids).toEqual(idsOf(SCRIPT[0]!.text!));
    expect(res.body.choices[0].logprobs.token_logprobs).toHaveLength(SCRIPT[0]!.text!.length);
    const streamed = await fetch(`${cluster.url}/v1/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', prompt: 'Say hi <turn>', stream: true }) });
    const text = await streamed.text();
    expect(streamed.headers.get('content-type')).toContain('text/event-stream');
    expect(text).not.toContain('token_ids');
    expect(text).not.toContain('"usage"');
    expect(text.trim().endsWith('data: [DONE]')).toBe(true);
    const [plain, stream] = await records('ro-asks');
    expect(plain!.response).toMatchObject({ choices: [{ text: SCRIPT[0]!.text, token_ids: idsOf(SCRIPT[0]!.text!) }] });
    expect(stream!.response).toMatchObject({ object: 'text_completion', choices: [{ text: '', finish_reason: 'stop' }] });
  });

  it('relays the Responses API, streamed and not', async () => {
    const key = await rollout('ro-resp');
    const client = openai(key, 'ro-resp');
    const first = await client.responses.create({ model: 'm', input: [{ role: 'user', content: 'Fix the bug.' }] });
    expect(first.output.find((o) => o.type === 'function_call')).toMatchObject({ name: 'bash', arguments: JSON.stringify({ cmd: 'ls -la /workspace' }) });
    const input: OpenAI.Responses.ResponseInputItem[] = [{ role: 'user', content: 'Fix the bug.' }, ...(first.output as OpenAI.Responses.ResponseInputItem[]), { type: 'function_call_output', call_id: (first.output.find((o) => o.type === 'function_call') as { call_id: string }).call_id, output: 'ok' }];
    const stream = client.responses.stream({ model: 'm', input });
    const final = await stream.finalResponse();
    expect(final.output.filter((o) => o.type === 'function_call').map((o) => (o as { arguments: string }).arguments)).toEqual(SCRIPT[1]!.toolCalls!.map((t) => JSON.stringify(t.arguments)));
    const calls = await records('ro-resp');
    expect(calls.map((c) => [c.api, c.stream, c.finishReason])).toEqual([['responses', false, 'completed'], ['responses', true, 'completed']]);
    expect((calls[1]!.response as { output: unknown[] }).output).toHaveLength(2);
  });

  it('relays an Anthropic agent (x-api-key), streamed and not, with count_tokens relayed and not recorded', async () => {
    const key = await rollout('ro-claude');
    const client = anthropic(key, 'ro-claude');
    const first = await client.messages.create({ model: 'm', max_tokens: 256, messages: [{ role: 'user', content: 'Fix the bug.' }] });
    expect(first.content.map((b) => b.type)).toEqual(['text', 'tool_use']);
    const tool = first.content.find((b) => b.type === 'tool_use')!;
    const messages: Anthropic.MessageParam[] = [{ role: 'user', content: 'Fix the bug.' }, { role: 'assistant', content: first.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: tool.id, content: 'ok' }] }];
    const counted = await client.messages.countTokens({ model: 'm', messages });
    expect(counted.input_tokens).toBeGreaterThan(0);
    const stream = client.messages.stream({ model: 'm', max_tokens: 256, messages });
    const final = await stream.finalMessage();
    expect(final.content.filter((b) => b.type === 'tool_use').map((b) => b.input)).toEqual(SCRIPT[1]!.toolCalls!.map((t) => t.arguments));
    const calls = await records('ro-claude');
    expect(calls.map((c) => [c.api, c.stream, c.finishReason])).toEqual([['messages', false, 'tool_use'], ['messages', true, 'tool_use']]);
    expect((calls[1]!.response as { content: unknown[] }).content).toEqual(final.content);
    expect(upstream.received.filter((r) => r.path === '/v1/messages').every((r) => r.headers.authorization === `Bearer ${SECRET}` && r.headers['anthropic-version'])).toBe(true);
  });

  it('answers errors in each SDK\'s shape: the upstream\'s (its credentials scrubbed), a limit, another rollout, no rollout key', async () => {
    const errUpstream = await ScriptedUpstream.start({ script: [{ error: { status: 400, message: 'context too long', echoAuthorization: true } }] });
    try {
      const put = await api(cluster, trainer, 'PUT', '/v1/jobs/job-err/model', { upstreams: [{ baseUrl: errUpstream.url }], headers: { authorization: `Bearer ${SECRET}`, 'x-api-key': SECRET } });
      expect(put.status).toBe(200);
      const key = await rollout('ro-err', 'job-err');
      const e1 = await openai(key, 'ro-err').chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
      expect(e1).toBeInstanceOf(OpenAI.BadRequestError);
      expect((e1 as Error).message).toContain('context too long');
      expect((e1 as Error).message).not.toContain(SECRET);
      const e2 = await anthropic(key, 'ro-err').messages.create({ model: 'm', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
      expect(e2).toBeInstanceOf(Anthropic.BadRequestError);
      expect((e2 as Error).message).not.toContain(SECRET);
      const calls = await records('ro-err');
      expect(calls.map((c) => [c.outcome, c.status])).toEqual([['upstream_error', 400], ['upstream_error', 400]]);
      expect(JSON.stringify(calls)).not.toContain(SECRET);
      expect(errUpstream.received[0]!.headers['x-api-key']).toBe(SECRET);
    } finally {
      await errUpstream.stop();
    }

    // A rollout past its model-call limit is refused, and says so.
    const key = await rollout('ro-limit');
    const { RolloutLimits } = await import('../src/model-gateway/index.ts');
    const limits = new RolloutLimits(redis, 600);
    await limits.set('ro-limit', { maxModelCalls: 1 });
    await openai(key, 'ro-limit').chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'go' }] });
    const refused = await openai(key, 'ro-limit').chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'again' }] }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.PermissionDeniedError);
    expect((refused as { code?: string }).code).toBe('model_limit_exceeded');
    expect(await limits.usage('ro-limit')).toMatchObject({ calls: 1, hit: 'max_model_calls', limits: { maxModelCalls: 1 } });
    const refusedAnthropic = await anthropic(key, 'ro-limit').messages.create({ model: 'm', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect(refusedAnthropic).toBeInstanceOf(Anthropic.PermissionDeniedError);
    expect((refusedAnthropic as { error: { type: string } }).error).toMatchObject({ type: 'error', error: { type: 'permission_error' } });

    // Another rollout's prefix, and a trainer's token on a model route.
    const other = await openai(key, 'ro-chat').chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect(other).toBeInstanceOf(OpenAI.NotFoundError);
    const asTrainer = await new OpenAI({ apiKey: trainer, baseURL: `${cluster.url}/v1`, maxRetries: 0 }).chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect(asTrainer).toBeInstanceOf(OpenAI.PermissionDeniedError);
    const badKey = await anthropic(`rbr_${'0'.repeat(40)}`, 'ro-limit').messages.create({ model: 'm', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect(badKey).toBeInstanceOf(Anthropic.AuthenticationError);
    expect((badKey as { error: unknown }).error).toMatchObject({ type: 'error', error: { type: 'authentication_error' } });
  });

  it('keeps a rollout\'s calls its own: the same request from another rollout is another call', async () => {
    const [a, b] = await Promise.all([rollout('ro-wall-a'), rollout('ro-wall-b')]);
    const body = { model: 'm', messages: [{ role: 'user' as const, content: 'same words' }] };
    const before = upstream.count('/v1/chat/completions');
    await Promise.all([openai(a, 'ro-wall-a').chat.completions.create(body), new OpenAI({ apiKey: b, baseURL: `${cluster.url}/v1`, maxRetries: 0 }).chat.completions.create(body)]);
    expect(upstream.count('/v1/chat/completions') - before).toBe(2);
    expect((await records('ro-wall-a')).map((c) => c.rolloutId)).toEqual(['ro-wall-a']);
    expect((await records('ro-wall-b')).map((c) => c.rolloutId)).toEqual(['ro-wall-b']);
    // Nothing of a rollout's is reachable with another rollout's key, and a job's binding not with any.
    expect((await api(cluster, b, 'GET', '/v1/rollouts/ro-wall-a/trajectory')).status).toBe(404);
    expect((await api(cluster, b, 'GET', '/v1/jobs/job-mg/model')).status).toBe(403);
    const models = await openai(a, 'ro-wall-a').models.list();
    expect(models.data.map((m) => m.id)).toEqual(['scripted-model']);
  });

  it('answers a retry of a call that already ended with the same answer, and a new request with the same body as a new turn', async () => {
    const key = await rollout('ro-again');
    const body = { model: 'm', messages: [{ role: 'user', content: 'same again' }] };
    const before = upstream.count('/v1/chat/completions');
    const first = await api({ url: `${cluster.url}/v1` }, key, 'POST', '/chat/completions', body);
    const retried = await api({ url: `${cluster.url}/v1` }, key, 'POST', '/chat/completions', body, { 'x-stainless-retry-count': '1' });
    expect(retried.body).toEqual(first.body);
    expect(retried.headers.get('x-rollbox-model-call')).toBe(first.headers.get('x-rollbox-model-call'));
    expect(upstream.count('/v1/chat/completions') - before).toBe(1);
    const fresh = await api({ url: `${cluster.url}/v1` }, key, 'POST', '/chat/completions', body);
    expect(fresh.headers.get('x-rollbox-turn')).toBe('2');
    expect(upstream.count('/v1/chat/completions') - before).toBe(2);
    expect((await records('ro-again')).map((c) => [c.turn, c.retriesJoined])).toEqual([[1, 0], [2, 0]]);
  });

  it('spreads a job\'s calls over its upstreams, and fails over from one that stopped', async () => {
    const [a, b] = await Promise.all([ScriptedUpstream.start({ script: SCRIPT }), ScriptedUpstream.start({ script: SCRIPT })]);
    try {
      expect((await api(cluster, trainer, 'PUT', '/v1/jobs/job-two/model', { upstreams: [{ baseUrl: a.url }, { baseUrl: b.url }] })).status).toBe(200);
      const key = await rollout('ro-two', 'job-two');
      const client = openai(key, 'ro-two');
      for (let i = 0; i < 6; i++) await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: `spread ${i}` }] });
      expect([a.count('/v1/chat/completions'), b.count('/v1/chat/completions')]).toEqual([3, 3]);
      await a.stop();
      for (let i = 0; i < 4; i++) await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: `failover ${i}` }] });
      expect(b.count('/v1/chat/completions')).toBe(7);
      const calls = await records('ro-two');
      expect(calls).toHaveLength(10);
      expect(calls.every((c) => c.outcome === 'ok')).toBe(true);
      expect(calls.slice(6).map((c) => c.upstream)).toEqual(Array(4).fill(b.url));
      // The stopped one was tried at most once (then passed over), never held a call.
      const refused = calls.slice(6).flatMap((c) => c.attempts.filter((t) => t.outcome === 'unreachable').map((t) => t.upstream));
      expect(refused.length).toBeLessThanOrEqual(1);
      expect(new Set(refused)).toEqual(new Set(refused.length ? [a.url] : []));
    } finally {
      await Promise.all([a.stop(), b.stop()]);
    }
  });
});

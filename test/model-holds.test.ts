import Anthropic from '@anthropic-ai/sdk';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ModelCallRecord } from '../src/api/index.ts';
import { RolloutKeyStore } from '../src/iam/index.ts';
import { ModelCallLog } from '../src/model-gateway/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { ScriptedUpstream, type ScriptTurn } from './support/model-upstream.ts';

// Holds, not failures: a preempted trainer (upstream gone, job paused) holds its agents'
// calls open, they go up in order once it is back, after the job's sandboxes thaw; an SDK
// retrying through a hold makes one call; an answer cut short reaches the agent whole.
const SCRIPT: ScriptTurn[] = [
  { text: 'Let me look around first.', toolCalls: [{ name: 'bash', arguments: { cmd: 'ls -la /workspace' } }] },
  { text: 'Found it. Fixing now.', toolCalls: [{ name: 'edit', arguments: { path: 'src/main.py', line: 12 } }] },
  { text: 'All tests pass.' },
];
const KEEPALIVE_MS = 300;
const EARLY_HEADERS_MS = 1000;
/** The hold the retry storm meets (60 s in the issue; shorter here, still longer than two SDK timeouts and their backoffs). */
const STORM_HOLD_MS = 13_000;
const STORM_SDK_TIMEOUT_MS = 5000;
let cluster: TestCluster;
let redis: Redis;
let keys: RolloutKeyStore;
let log: ModelCallLog;
let upstream: ScriptedUpstream;
let trainer: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-mh' }], env: { ROLLBOX_MODEL_KEEPALIVE_MS: String(KEEPALIVE_MS), ROLLBOX_MODEL_EARLY_HEADERS_MS: String(EARLY_HEADERS_MS), ROLLBOX_MODEL_PROBE_MS: '200', ROLLBOX_MODEL_LEASE_MS: '1500' } });
  redis = new Redis(cluster.redisUrl);
  keys = new RolloutKeyStore(redis);
  log = new ModelCallLog(redis);
  upstream = await ScriptedUpstream.start({ script: SCRIPT });
  trainer = await cluster.token('team-mh', ['rollout:submit', 'sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
});
afterAll(async () => {
  await upstream?.stop();
  redis?.disconnect();
  await cluster?.stop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const bind = async (job: string, target = upstream) => expect((await api(cluster, trainer, 'PUT', `/v1/jobs/${job}/model`, { upstreams: [{ baseUrl: target.url }], headers: { authorization: 'Bearer sk-hold-secret-42' } })).status).toBe(200);
const rollout = (id: string, job: string) => keys.issue({ tenant: 'team-mh', rolloutId: id, job, ttlSeconds: 600 });
const records = async (id: string) => (await log.list(id)).calls.sort((a, b) => a.turn - b.turn);
const messages = (content: string): OpenAI.ChatCompletionMessageParam[] => [{ role: 'user', content }];
const textOf = (chunks: OpenAI.ChatCompletionChunk[]) => chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
const argsOf = (chunks: OpenAI.ChatCompletionChunk[]) => chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []).map((t) => t.function?.arguments ?? '').join('');
const held = async (job: string) => (await api(cluster, trainer, 'GET', `/v1/jobs/${job}/model`)).body.hold as { paused: boolean; upstreamDown: boolean; heldCalls: number };

describe('model holds', () => {
  it('holds calls while the upstream is gone and the job paused, then answers each once, after the sandboxes thaw', async () => {
    const sandbox = (await api(cluster, trainer, 'POST', '/v1/sandboxes', { job: 'job-pre' })).body.id as string;
    await bind('job-pre');
    const key = await rollout('ro-pre', 'job-pre');
    const sdkTimeoutMs = 2000;
    const client = new OpenAI({ apiKey: key, baseURL: `${cluster.url}/v1/rollouts/ro-pre/model/v1`, timeout: sdkTimeoutMs, maxRetries: 2 });
    const statesOnArrival: string[] = [];
    upstream.onRequest = async () => void statesOnArrival.push((await api(cluster, trainer, 'GET', `/v1/sandboxes/${sandbox}`)).body.state);
    await upstream.stop();
    const before = upstream.count('/v1/chat/completions');

    const plain = client.chat.completions.create({ model: 'm', messages: messages('plain') });
    const streamed = (async () => {
      const chunks: OpenAI.ChatCompletionChunk[] = [];
      for await (const chunk of await client.chat.completions.create({ model: 'm', messages: messages('streamed'), stream: true })) chunks.push(chunk);
      return chunks;
    })();
    const raw = fetch(`${cluster.url}/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', messages: messages('raw'), stream: true }) }).then((r) => r.text());
    const anthropic = new Anthropic({ apiKey: key, baseURL: `${cluster.url}/v1/rollouts/ro-pre/model`, timeout: sdkTimeoutMs, maxRetries: 2 }).messages.create({ model: 'm', max_tokens: 64, messages: [{ role: 'user', content: 'claude' }] });
    const rawClaude = fetch(`${cluster.url}/v1/messages`, { method: 'POST', headers: { 'x-api-key': key, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm', max_tokens: 64, stream: true, messages: [{ role: 'user', content: 'raw claude' }] }) }).then((r) => r.text());
    await waitFor('5 calls held', async () => (await held('job-pre')).heldCalls === 5);

    // The trainer is preempted: its upstream is gone for twice the agents' timeout, and it pauses its job.
    await sleep(2 * sdkTimeoutMs);
    const paused = await api(cluster, trainer, 'POST', '/v1/jobs/job-pre/pause', {});
    expect(paused.body.model).toMatchObject({ paused: true, heldCalls: 5 });
    expect(paused.body.results).toEqual([expect.objectContaining({ id: sandbox, state: 'paused' })]);
    // It comes back: its upstream answers again, but no call goes up until it resumes the job
    // (a probe the line released before the pause has met the stopped upstream by now).
    await sleep(500);
    await upstream.restart();
    await sleep(1000);
    expect(upstream.count('/v1/chat/completions') - before).toBe(0);
    const resumed = await api(cluster, trainer, 'POST', '/v1/jobs/job-pre/resume', {});
    expect(resumed.body.model).toMatchObject({ paused: false });

    const [answer, chunks, text, claude, claudeText] = await Promise.all([plain, streamed, raw, anthropic, rawClaude]);
    expect(answer.choices[0]!.message.content).toBe(SCRIPT[0]!.text);
    expect(textOf(chunks)).toBe(SCRIPT[0]!.text);
    expect(JSON.parse(argsOf(chunks))).toEqual(SCRIPT[0]!.toolCalls![0]!.arguments);
    expect(claude.content[0]).toMatchObject({ type: 'text', text: SCRIPT[0]!.text });
    // Keepalives while held (comment lines, no blank line after them), then the whole stream.
    expect(text.startsWith(': keepalive\n')).toBe(true);
    expect(text).not.toContain(': keepalive\n\n');
    expect(text.trim().endsWith('data: [DONE]')).toBe(true);
    expect(claudeText.startsWith('event: ping\ndata: {"type": "ping"}\n\n')).toBe(true);
    expect(claudeText.trim().endsWith('data: {"type":"message_stop"}')).toBe(true);
    expect(upstream.count('/v1/chat/completions') - before).toBe(3);
    expect(upstream.count('/v1/messages')).toBe(2);
    expect(statesOnArrival.length).toBe(5);
    expect(new Set(statesOnArrival)).toEqual(new Set(['running']));

    const calls = await records('ro-pre');
    expect(calls).toHaveLength(5);
    for (const call of calls) {
      expect(call.outcome).toBe('ok');
      expect(call.retriesJoined).toBe(0);
      expect(call.heldMs).toBeGreaterThanOrEqual(2 * sdkTimeoutMs);
      expect(call.attempts.at(-1)).toMatchObject({ outcome: 'ok' });
      expect(call.attempts.filter((a) => a.outcome === 'ok')).toHaveLength(1);
    }
    const figures = (await api(cluster, trainer, 'GET', '/v1/jobs/job-pre/model')).body.figures;
    expect(figures).toMatchObject({ calls: 5, failedCalls: 0 });
    expect(figures.heldMs).toBeGreaterThanOrEqual(5 * 2 * sdkTimeoutMs);
    upstream.onRequest = undefined;
    await api(cluster, trainer, 'DELETE', `/v1/sandboxes/${sandbox}`);
  });

  it('sends held calls up in the order they came', async () => {
    await bind('job-order');
    const key = await rollout('ro-order', 'job-order');
    const client = new OpenAI({ apiKey: key, baseURL: `${cluster.url}/v1`, maxRetries: 0 });
    expect((await api(cluster, trainer, 'POST', '/v1/jobs/job-order/pause', {})).body.model.paused).toBe(true);
    const calls: Promise<unknown>[] = [];
    for (let i = 0; i < 5; i++) {
      const body = { model: 'm', messages: messages(`order-${i}`) };
      calls.push(
        i % 2
          ? client.chat.completions.create(body)
          : (async () => {
              for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) void chunk;
            })(),
      );
      await waitFor(`call ${i} held`, async () => (await held('job-order')).heldCalls === i + 1);
    }
    const from = upstream.received.length;
    await api(cluster, trainer, 'POST', '/v1/jobs/job-order/resume', {});
    await Promise.all(calls);
    const order = upstream.received.slice(from).map((r) => (r.body.messages as { content: string }[])[0]!.content);
    expect(order).toEqual(['order-0', 'order-1', 'order-2', 'order-3', 'order-4']);
  });

  it('mends an answer cut after its first tokens: one coherent stream for the agent, the re-issue recorded', async () => {
    await bind('job-cut');
    const key = await rollout('ro-cut', 'job-cut');
    const client = new OpenAI({ apiKey: key, baseURL: `${cluster.url}/v1/rollouts/ro-cut/model/v1`, maxRetries: 0 });
    const before = upstream.received.length;

    // Cut twice: after 5 events, then (the re-issue) after 9 of its own.
    upstream.cuts = [5, 9];
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const chunk of await client.chat.completions.create({ model: 'm', messages: messages('cut chat'), stream: true })) chunks.push(chunk);
    expect(textOf(chunks)).toBe(SCRIPT[0]!.text);
    expect(JSON.parse(argsOf(chunks))).toEqual(SCRIPT[0]!.toolCalls![0]!.arguments);
    // One role, one tool call start, one finish, one id: the re-issue's repeats and ids hidden.
    expect(chunks.filter((c) => c.choices[0]?.delta.role).length).toBe(1);
    expect(chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []).filter((t) => t.id).length).toBe(1);
    expect(chunks.filter((c) => c.choices[0]?.finish_reason).length).toBe(1);
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);

    upstream.cuts = [6];
    const claude = await new Anthropic({ apiKey: key, baseURL: `${cluster.url}/v1/rollouts/ro-cut/model`, maxRetries: 0 }).messages.stream({ model: 'm', max_tokens: 64, messages: [{ role: 'user', content: 'cut claude' }] }).finalMessage();
    expect(claude.content).toEqual([{ type: 'text', text: SCRIPT[0]!.text }, expect.objectContaining({ type: 'tool_use', name: 'bash', input: SCRIPT[0]!.toolCalls![0]!.arguments })]);

    upstream.cuts = [7];
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    const stream = client.responses.stream({ model: 'm', input: [{ role: 'user', content: 'cut responses' }] });
    for await (const event of stream) events.push(event);
    const final = await stream.finalResponse();
    expect(final.output_text).toBe(SCRIPT[0]!.text);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    expect(new Set(events.filter((e) => e.type === 'response.output_item.added').map((e) => (e as { item: { id: string } }).item.id)).size).toBe(2);

    upstream.cuts = [0];
    const plain = await client.chat.completions.create({ model: 'm', messages: messages('cut plain') });
    expect(plain.choices[0]!.message.content).toBe(SCRIPT[0]!.text);

    expect(upstream.received.length - before).toBe(9);
    const calls = await records('ro-cut');
    expect(calls.map((c) => [c.api, c.attempts.map((a) => a.outcome)])).toEqual([
      ['chat.completions', ['cut', 'cut', 'ok']],
      ['messages', ['cut', 'ok']],
      ['responses', ['cut', 'ok']],
      ['chat.completions', ['cut', 'ok']],
    ]);
    for (const call of calls.slice(0, 3)) expect(call.attempts.at(-1)!.deliveredChars).toBeGreaterThan(0);
    expect(calls[0]!.attempts[2]!.deliveredChars).toBeGreaterThan(calls[0]!.attempts[1]!.deliveredChars!);
    const chat = calls[0]!.response as { choices: { message: { content: string; tool_calls: { id: string }[] } }[] };
    expect(chat.choices[0]!.message.content).toBe(SCRIPT[0]!.text);
    expect(chat.choices[0]!.message.tool_calls[0]!.id).toBe(chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []).find((t) => t.id)!.id);
  });

  it('records one call per turn when an SDK (5 s timeout, 5 retries) retries through a long hold', async () => {
    // A gateway that never answers a held call early: the SDK times out and retries, and each retry joins the call.
    const late = await cluster.spawnGateway({ name: 'gw-late', env: { ROLLBOX_MODEL_EARLY_HEADERS_MS: '600000', ROLLBOX_MODEL_KEEPALIVE_MS: '1000' } });
    await bind('job-storm');
    const key = await rollout('ro-storm', 'job-storm');
    const sdk = (url: string) => new OpenAI({ apiKey: key, baseURL: `${url}/v1`, timeout: STORM_SDK_TIMEOUT_MS, maxRetries: 5 });
    await api(cluster, trainer, 'POST', '/v1/jobs/job-storm/pause', {});
    const before = upstream.count('/v1/chat/completions');
    const startedMs = Date.now();
    const stormed = sdk(late.url).chat.completions.create({ model: 'm', messages: messages('storm') });
    const early = sdk(cluster.url).chat.completions.create({ model: 'm', messages: messages('early 200') });
    const streamed = (async () => {
      const chunks: OpenAI.ChatCompletionChunk[] = [];
      for await (const chunk of await sdk(late.url).chat.completions.create({ model: 'm', messages: messages('stream'), stream: true })) chunks.push(chunk);
      return chunks;
    })();
    await sleep(STORM_HOLD_MS);
    await api(cluster, trainer, 'POST', '/v1/jobs/job-storm/resume', {});
    const [a, b, c] = await Promise.all([stormed, early, streamed]);
    expect(Date.now() - startedMs).toBeGreaterThanOrEqual(STORM_HOLD_MS);
    expect([a.choices[0]!.message.content, b.choices[0]!.message.content, textOf(c)]).toEqual([SCRIPT[0]!.text, SCRIPT[0]!.text, SCRIPT[0]!.text]);
    // The next turn, unheld.
    const next = await sdk(late.url).chat.completions.create({ model: 'm', messages: [...messages('storm'), a.choices[0]!.message, { role: 'tool', tool_call_id: a.choices[0]!.message.tool_calls![0]!.id, content: 'ok' }] });
    expect(next.choices[0]!.message.content).toBe(SCRIPT[1]!.text);

    expect(upstream.count('/v1/chat/completions') - before).toBe(4);
    const calls = await records('ro-storm');
    expect(calls).toHaveLength(4);
    const byContent = (content: string) => calls.filter((r: ModelCallRecord) => JSON.stringify(r.request).includes(`"content":"${content}"`));
    const storm = byContent('storm');
    expect(storm.map((r) => r.turn)).toHaveLength(2);
    // The timed-out requests and their retries joined the one call (at least two retries fit in the hold).
    expect(storm.find((r) => r.heldMs > 0)!.retriesJoined).toBeGreaterThanOrEqual(2);
    expect(byContent('early 200')[0]!.retriesJoined).toBe(0);
    expect(byContent('stream')[0]!.retriesJoined).toBe(0);
  });
});

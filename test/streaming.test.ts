import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-sse' }] });
  token = await cluster.token('streamer', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
});
afterAll(async () => cluster?.stop());

interface SseEvent {
  event: string;
  id?: string;
  data: string;
  atMs: number;
}

/** Reads server-sent events; stops after `limit` events (dropping the connection) or at the end. */
async function streamExec(sandboxId: string, body: object, options: { limit?: number; lastEventId?: string } = {}): Promise<SseEvent[]> {
  const controller = new AbortController();
  const started = Date.now();
  const response = await fetch(`${cluster.url}/v1/sandboxes/${sandboxId}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'text/event-stream', ...(options.lastEventId ? { 'last-event-id': options.lastEventId } : {}) },
    body: JSON.stringify(body),
    signal: controller.signal,
  });
  expect(response.headers.get('content-type')).toContain('text/event-stream');
  const events: SseEvent[] = [];
  const decoder = new TextDecoder();
  let buffer = '';
  const reader = response.body!.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return events;
    buffer += decoder.decode(value, { stream: true });
    let end: number;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event: SseEvent = { event: 'message', data: '', atMs: Date.now() - started };
      for (const line of block.split('\n')) {
        const [field, ...rest] = line.split(':');
        const value = rest.join(':').replace(/^ /, '');
        if (field === 'event') event.event = value;
        else if (field === 'id') event.id = value;
        else if (field === 'data') event.data += (event.data ? '\n' : '') + value;
      }
      events.push(event);
      if (options.limit && events.length >= options.limit) {
        controller.abort();
        return events;
      }
    }
  }
}

describe('streaming exec', () => {
  it('delivers the first chunk before the command ends, then an exit event', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const events = await streamExec(sandbox.id, { cmd: 'for i in 1 2 3; do echo line$i; sleep 1; done; echo done >&2' });
    const output = events.filter((e) => e.event === 'stdout').map((e) => e.data).join('');
    expect(output).toBe('line1\nline2\nline3\n');
    expect(events.filter((e) => e.event === 'stderr').map((e) => e.data).join('')).toBe('done\n');
    const exit = events.at(-1)!;
    expect(exit.event).toBe('exit');
    expect(JSON.parse(exit.data)).toMatchObject({ exitCode: 0, timedOut: false, replayed: false });
    const firstChunk = events.find((e) => e.event === 'stdout')!;
    expect(firstChunk.atMs).toBeLessThan(exit.atMs - 1500);
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('lets a client that dropped reconnect with the same commandId and get what it missed, running the command once', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const body = { cmd: 'echo ran >> /root/runs; for i in 1 2 3; do echo part$i; sleep 0.5; done', commandId: 'stream-1' };
    const before = await streamExec(sandbox.id, body, { limit: 1 });
    expect(before[0]).toMatchObject({ event: 'stdout', data: 'part1\n' });
    const after = await streamExec(sandbox.id, body, { lastEventId: before[0]!.id });
    expect(after.filter((e) => e.event === 'stdout').map((e) => e.data).join('')).toBe('part2\npart3\n');
    expect(JSON.parse(after.at(-1)!.data)).toMatchObject({ exitCode: 0, replayed: true });
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, { argv: ['cat', '/root/runs'] })).body.stdout).toBe('ran\n');
    // A buffered re-send of the same command replays the whole recorded output.
    expect((await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, body)).body).toMatchObject({ stdout: 'part1\npart2\npart3\n', replayed: true });
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('answers errors before the stream starts as JSON with a status', async () => {
    const response = await fetch(`${cluster.url}/v1/sandboxes/sbx_missing/exec`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ argv: ['true'] }),
    });
    expect(response.status).toBe(404);
  });
});

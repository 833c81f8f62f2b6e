import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { serverSentEvents } from '../src/client/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-sse' }] });
  token = await cluster.token('streamer', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
});
afterAll(async () => cluster?.stop());

type SseEvent = { event: string; id?: string; data: string };

/**
 * Streams an exec as server-sent events (parsed by the client's own reader). `onEvent` sees
 * each event as it arrives; returning `'stop'` drops the connection there.
 */
async function streamExec(sandboxId: string, body: object, options: { lastEventId?: string; onEvent?: (e: SseEvent) => Promise<'stop' | void> | 'stop' | void } = {}): Promise<SseEvent[]> {
  const controller = new AbortController();
  const response = await fetch(`${cluster.url}/v1/sandboxes/${sandboxId}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'text/event-stream', ...(options.lastEventId ? { 'last-event-id': options.lastEventId } : {}) },
    body: JSON.stringify(body),
    signal: controller.signal,
  });
  expect(response.headers.get('content-type')).toContain('text/event-stream');
  const events: SseEvent[] = [];
  for await (const event of serverSentEvents(response.body!)) {
    events.push(event);
    if ((await options.onEvent?.(event)) === 'stop') break; // cancels the body
  }
  controller.abort(); // and drops the connection, as a client that went away would
  return events;
}

describe('streaming exec', () => {
  it('delivers the first chunk before the command ends, then an exit event', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    // The command cannot end before the test has seen its first chunk: it waits for a file
    // the test creates only then (through a second exec).
    const gate = 'while [ ! -e /tmp/go ]; do sleep 0.05; done';
    let opened = false;
    const events = await streamExec(sandbox.id, { cmd: `echo line1; ${gate}; echo line2; echo done >&2` }, {
      onEvent: async (e) => {
        if (e.event === 'stdout' && !opened) {
          opened = true;
          expect(e.data).toBe('line1\n');
          expect((await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, { cmd: 'touch /tmp/go' })).body.exitCode).toBe(0);
        }
      },
    });
    expect(opened).toBe(true);
    expect(events.filter((e) => e.event === 'stdout').map((e) => e.data).join('')).toBe('line1\nline2\n');
    expect(events.filter((e) => e.event === 'stderr').map((e) => e.data).join('')).toBe('done\n');
    const exit = events.at(-1)!;
    expect(exit.event).toBe('exit');
    expect(JSON.parse(exit.data)).toMatchObject({ exitCode: 0, timedOut: false, replayed: false });
    await api(cluster, token, 'DELETE', `/v1/sandboxes/${sandbox.id}`);
  });

  it('lets a client that dropped reconnect with the same commandId and get what it missed, running the command once', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    // part2 and part3 come only after the test has dropped the stream and opened the gate.
    const body = { cmd: 'echo ran >> /root/runs; echo part1; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo part2; echo part3', commandId: 'stream-1' };
    const before = await streamExec(sandbox.id, body, { onEvent: () => 'stop' });
    expect(before).toEqual([expect.objectContaining({ event: 'stdout', data: 'part1\n' })]);
    await api(cluster, token, 'POST', `/v1/sandboxes/${sandbox.id}/exec`, { cmd: 'touch /tmp/go' });
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

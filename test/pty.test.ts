import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { Sandbox } from 'e2b';
import { createParser } from 'eventsource-parser';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Scope } from '../src/api/index.ts';
import { RollboxClient, type ExecStreamEvent } from '../src/client/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

/**
 * Terminals in sandboxes: the init allocates a pty, runs the command on it (its
 * controlling terminal), streams its output, takes typed keys, resizes it (SIGWINCH to
 * the foreground group) and reports its end; through rollbox's API and E2B's `pty.*`.
 */
const run = promisify(execFile);
const REPO_ROOT = path.resolve(import.meta.dirname, '..');
const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete'];
let cluster: TestCluster;
let token: string;
const saved: NodeJS.ProcessEnv = { ...process.env };

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-pty' }], env: { ROLLBOX_E2B_BASE_TEMPLATE: 'off' } });
  token = await cluster.token('pty-team', SCOPES);
  const issued = await run(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), 'e2b-key', 'issue', '--tenant', 'pty-e2b', '--name', 'pty'], { env: { ...process.env, REDIS_URL: cluster.redisUrl } });
  Object.assign(process.env, { E2B_API_URL: cluster.url, E2B_SANDBOX_URL: cluster.url, E2B_API_KEY: issued.stdout.trim() });
});
afterAll(async () => {
  process.env = saved;
  await cluster?.stop();
});

/** A terminal's output as it comes, read from a server-sent event stream. */
class Screen {
  text = '';
  exit: { exitCode: number } | undefined;
  private readonly done: Promise<void>;
  private readonly abort = new AbortController();

  constructor(response: Promise<Response>) {
    this.done = (async () => {
      const res = await response;
      if (!res.ok || !res.body) throw new Error(`stream answered ${res.status}: ${await res.text()}`);
      const parser = createParser({
        onEvent: (ev) => {
          if (ev.event === 'pty') this.text += JSON.parse(ev.data) as string;
          else if (ev.event === 'exit') this.exit = JSON.parse(ev.data);
          else if (ev.event === 'error') throw new Error(ev.data);
        },
      });
      const decoder = new TextDecoder();
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) parser.feed(decoder.decode(chunk, { stream: true }));
    })().catch((err: unknown) => {
      if (!this.abort.signal.aborted) throw err;
    });
  }

  static follow(url: string, init: RequestInit = {}): Screen {
    const screen: Screen = new Screen(Promise.resolve().then(() => fetch(url, { ...init, signal: screen.abort.signal })));
    return screen;
  }

  /** Waits for the output (from `from` on) to match; returns the index after the match. */
  async waitFor(pattern: RegExp, from = 0): Promise<number> {
    const m = await waitFor(`${pattern} on the terminal (got ${JSON.stringify(this.text.slice(from).slice(-300))})`, async () => pattern.exec(this.text.slice(from)) ?? undefined, 15_000);
    return from + m.index + m[0].length;
  }

  async ended(): Promise<void> {
    await this.done;
  }

  close(): void {
    this.abort.abort();
  }
}

describe("rollbox's pty API", () => {
  it('runs the image shell on a terminal: typed keys echo, tty and stty see the pty, resize signals the foreground group, kill ends it', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const base = `/v1/sandboxes/${sandbox.id}`;
    const started = await api(cluster, token, 'POST', `${base}/pty`, { cols: 100, rows: 30, commandId: 'term-1', env: { PS1: 'rb$ ' } });
    expect(started.status).toBe(202);
    expect(started.body).toMatchObject({ commandId: 'term-1', state: expect.stringMatching(/queued|running/), pty: { cols: 100, rows: 30 } });
    const screen = Screen.follow(`${cluster.url}${base}/commands/term-1`, { headers: { authorization: `Bearer ${token}`, accept: 'text/event-stream' } });
    const type = async (data: string) => expect((await api(cluster, token, 'POST', `${base}/commands/term-1/stdin`, { data })).status).toBe(200);
    try {
      let at = await screen.waitFor(/rb\$ /);
      // Keys typed at the prompt come back as the terminal echoes them, before any Enter.
      await type('echo typed-keys');
      at = await screen.waitFor(/echo typed-keys/, at);
      await type('\n');
      at = await screen.waitFor(/\r\ntyped-keys\r\n/, at);
      await type('tty; stty size; echo "TERM=$TERM"\n');
      at = await screen.waitFor(/\/dev\/pts\/\d+\r\n30 100\r\nTERM=xterm-256color\r\n/, at);

      // A foreground program hears SIGWINCH when the terminal is resized, and sees the new size.
      await type(`sh -c 'trap "stty size; echo winched; exit 0" WINCH; echo waiting; while :; do sleep 0.1; done'\n`);
      at = await screen.waitFor(/\r\nwaiting\r\n/, at);
      const resized = await api(cluster, token, 'POST', `${base}/commands/term-1/resize`, { cols: 120, rows: 40 });
      expect(resized).toMatchObject({ status: 200, body: { commandId: 'term-1', state: 'running' } });
      at = await screen.waitFor(/40 120\r\nwinched\r\n/, at);

      // ^C reaches the foreground job as SIGINT (the terminal's line discipline), not the shell.
      await type('sleep 100\n');
      await screen.waitFor(/sleep 100\r\n/, at);
      await type('\x03');
      await type('echo after-interrupt\n');
      at = await screen.waitFor(/\r\nafter-interrupt\r\n/, at);

      // A command not on a terminal has no size to change.
      await api(cluster, token, 'POST', `${base}/exec`, { cmd: 'sleep 30', background: true, commandId: 'plain' });
      const notPty = await waitFor('the plain command to run', async () => {
        const r = await api(cluster, token, 'POST', `${base}/commands/plain/resize`, { cols: 10, rows: 10 });
        return r.body.error?.message?.includes('not running') ? undefined : r;
      });
      expect(notPty).toMatchObject({ status: 409, body: { error: { code: 'invalid_state' } } });
      expect((await api(cluster, token, 'POST', `${base}/commands/term-1/resize`, { cols: 0, rows: 10 })).status).toBe(400);

      expect((await api(cluster, token, 'POST', `${base}/commands/term-1/signal`, { signal: 'KILL' })).status).toBe(200);
      await screen.ended();
      expect(screen.exit).toMatchObject({ exitCode: 137 });
      const record = await api(cluster, token, 'GET', `${base}/commands/term-1`);
      expect(record.body).toMatchObject({ state: 'done', pty: { cols: 100, rows: 30 }, result: { exitCode: 137 } });
      // The result keeps the tail of what the terminal showed.
      expect(record.body.result.stdout).toContain('after-interrupt');
      const log = await api(cluster, token, 'GET', `${base}/commands`);
      expect(log.body.commands.find((c: { commandId: string }) => c.commandId === 'term-1')).toMatchObject({ state: 'done', pty: { cols: 100, rows: 30 } });
    } finally {
      screen.close();
      await api(cluster, token, 'DELETE', base);
    }
  });

  it('streams a given command on a terminal from the create request; it ends with its exit code', async () => {
    const { body: sandbox } = await api(cluster, token, 'POST', '/v1/sandboxes', {});
    const base = `/v1/sandboxes/${sandbox.id}`;
    // `test -t` holds only on a terminal; a command without one says so too.
    const screen = Screen.follow(`${cluster.url}${base}/pty`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, accept: 'text/event-stream', 'content-type': 'application/json' },
      body: JSON.stringify({ cmd: 'test -t 0 && test -t 1 && echo on-a-tty; stty size; exit 3', cols: 33, rows: 11 }),
    });
    await screen.ended();
    expect(screen.text).toBe('on-a-tty\r\n11 33\r\n');
    expect(screen.exit).toMatchObject({ exitCode: 3 });
    const plain = await api(cluster, token, 'POST', `${base}/exec`, { cmd: 'test -t 1 || echo no-tty' });
    expect(plain.body.stdout).toBe('no-tty\n');
    const bad = await api(cluster, token, 'POST', `${base}/pty`, { argv: ['sh'], cmd: 'sh' });
    expect(bad).toMatchObject({ status: 400, body: { error: { code: 'invalid_request' } } });
    await api(cluster, token, 'DELETE', base);
  });
});

describe('the TypeScript client', () => {
  it('opens a terminal, follows it, types, resizes and kills it', async () => {
    const client = new RollboxClient({ baseUrl: cluster.url, token });
    const sandbox = await client.createSandbox();
    try {
      const started = await client.createPty(sandbox.id, { cols: 50, rows: 20, env: { PS1: 'ts$ ' } });
      expect(started.pty).toEqual({ cols: 50, rows: 20 });
      let text = '';
      let exit: Extract<ExecStreamEvent, { type: 'exit' }> | undefined;
      const following = (async () => {
        for await (const ev of client.followCommand(sandbox.id, started.commandId)) {
          if (ev.type === 'pty') text += ev.data;
          else if (ev.type === 'exit') exit = ev;
        }
      })();
      await waitFor('the prompt', async () => text.includes('ts$ '));
      await client.writeStdin(sandbox.id, started.commandId, 'stty size\n');
      await waitFor('the first size', async () => text.includes('\r\n20 50\r\n'));
      await client.resizePty(sandbox.id, started.commandId, { cols: 70, rows: 25 });
      await client.writeStdin(sandbox.id, started.commandId, 'stty size\n');
      await waitFor('the new size', async () => text.includes('\r\n25 70\r\n'));
      await client.signalCommand(sandbox.id, started.commandId, 'KILL');
      await following;
      expect(exit?.result.exitCode).toBe(137);
    } finally {
      await client.deleteSandbox(sandbox.id);
    }
  });
});

describe("E2B's sandbox.pty", () => {
  it('creates a terminal, sends keys, resizes, connects a second reader and kills it', async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120_000 });
    try {
      const decoder = new TextDecoder();
      let seen = '';
      const terminal = await sbx.pty.create({ cols: 80, rows: 24, envs: { PS1: 'e2b$ ' }, onData: (data) => void (seen += decoder.decode(data, { stream: true })) });
      const waitSeen = async (pattern: RegExp, from = 0) => {
        const m = await waitFor(`${pattern} from the pty (got ${JSON.stringify(seen.slice(from).slice(-300))})`, async () => pattern.exec(seen.slice(from)) ?? undefined);
        return from + m.index + m[0].length;
      };
      const keys = (s: string) => sbx.pty.sendInput(terminal.pid, new TextEncoder().encode(s));
      let at = await waitSeen(/e2b\$ /);
      await keys('tty; stty size; echo "$TERM $LANG"\n');
      at = await waitSeen(/\/dev\/pts\/\d+\r\n24 80\r\nxterm-256color C\.UTF-8\r\n/, at);
      await sbx.pty.resize(terminal.pid, { cols: 132, rows: 43 });
      await keys('stty size\n');
      at = await waitSeen(/\r\n43 132\r\n/, at);

      // E2B lists it as the SDK started it; a second client connects and reads it.
      expect((await sbx.commands.list()).find((p) => p.pid === terminal.pid)).toMatchObject({ cmd: '/bin/bash', args: ['-i', '-l'] });
      let second = '';
      const again = await sbx.pty.connect(terminal.pid, { onData: (data) => void (second += decoder.decode(data)) });
      await keys('echo from-both\n');
      await waitSeen(/\r\nfrom-both\r\n/, at);
      await waitFor('the second reader to see it', async () => second.includes('from-both'));

      expect(await sbx.pty.kill(terminal.pid)).toBe(true);
      const ended = await terminal.wait().catch((err: unknown) => err as { exitCode: number });
      expect(ended.exitCode).toBe(137);
      await again.wait().catch(() => undefined);
      expect(await sbx.pty.kill(terminal.pid)).toBe(false);
      await expect(sbx.pty.resize(terminal.pid, { cols: 10, rows: 10 })).rejects.toThrow();
    } finally {
      await sbx.kill();
    }
  });
});

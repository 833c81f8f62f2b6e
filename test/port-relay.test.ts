import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RollboxError } from '../src/api/index.ts';
import { PortForwarder, PortRelay, PortTickets } from '../src/ports/index.ts';
import { waitFor } from './support/cluster.ts';
import { useScratchRedis } from './support/scratch-redis.ts';

/**
 * The worker host's port relay on its own (src/ports/relay.ts and rollbox-portfwd's relay
 * door): the real helper, tickets signed under a real Redis's secret, and, as "sandboxes", a
 * network namespace this test makes (`unshare --net`, a busybox httpd on its loopback) and
 * the test's own namespace (a TCP server of this process). The whole way from a gateway
 * through a real container is test/ports.test.ts's.
 */
const scratch = useScratchRedis('port-relay');
let dir: string;
let relay: PortRelay;
let relayPort: number;
let tickets: PortTickets;
/** A namespace of the test's with a page on its loopback's `port`, and the same port on the host's loopback serving another. */
let netns: ChildProcess;
let port: number;
let hostServer: net.Server;
let echo: net.Server;
const PAGE = 'inside the namespace\n';
const OPEN = new Map<string, number>();

/** Everything the relay answers to what is written, until it closes. */
function exchange(write: string | Buffer, options: { endAfterWrite?: boolean } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port: relayPort, allowHalfOpen: options.endAfterWrite === true }, () => {
      socket.write(write);
      if (options.endAfterWrite) socket.end();
    });
    let got = '';
    socket.on('data', (chunk: Buffer) => (got += chunk.toString()));
    socket.once('close', () => resolve(got));
    socket.once('error', reject);
    socket.setTimeout(10_000, () => socket.destroy(new Error(`no end; got ${JSON.stringify(got)}`)));
  });
}

const refusal = (answer: string) => JSON.parse(answer.replace(/^err /, '').trim()) as { code: string; message: string };

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-port-relay-'));
  await fs.writeFile(path.join(dir, 'index.html'), PAGE);
  // The same port on the host's own loopback answers something else: the relay must not land there.
  hostServer = net.createServer((s) => s.end('HTTP/1.0 200 OK\r\n\r\nthe host\n'));
  await new Promise<void>((resolve) => hostServer.listen(0, '127.0.0.1', () => resolve()));
  port = (hostServer.address() as net.AddressInfo).port;
  netns = spawn('unshare', ['--net', 'sh', '-c', `ip link set lo up && exec busybox httpd -f -p 127.0.0.1:${port} -h ${dir}`], { stdio: 'ignore' });
  // An echo server in the test's own namespace that passes a half-close on.
  echo = net.createServer({ allowHalfOpen: true }, (s) => {
    s.pipe(s);
  });
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', () => resolve()));
  tickets = new PortTickets(scratch.redis);
  OPEN.set('sbx_netns', netns.pid!);
  OPEN.set('sbx_self', process.pid);
  relay = new PortRelay({
    tickets,
    forwarder: new PortForwarder({ dir: path.join(dir, 'ports') }),
    netnsOf: async (id) => {
      if (id === 'sbx_paused') throw new RollboxError('invalid_state', `sandbox ${id} is paused; resume it first`);
      const pid = OPEN.get(id);
      if (!pid) throw new RollboxError('invalid_state', `sandbox ${id} is not running on worker host test`);
      return pid;
    },
    controlPath: path.join(dir, 'ports', 'relay-control.sock'),
  });
  relayPort = Number((await relay.listen('127.0.0.1', 0)).split(':')[1]);
  // The namespace's httpd is up once the relay reaches it.
  await waitFor('httpd in the namespace', async () => (await exchange(`${await tickets.mint({ sandboxId: 'sbx_netns', port })}\nGET /index.html HTTP/1.0\r\n\r\n`)).includes(PAGE), 10_000);
});

afterAll(async () => {
  await relay?.stop();
  netns?.kill('SIGKILL');
  hostServer?.close();
  echo?.close();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

describe("a worker host's port relay (rollbox-portfwd's door, the worker's verdict)", () => {
  it("takes a request sent with its ticket into the sandbox's namespace, not the host's loopback", async () => {
    const answer = await exchange(`${await tickets.mint({ sandboxId: 'sbx_netns', port })}\nGET /index.html HTTP/1.0\r\n\r\n`);
    expect(answer).toMatch(/^ok\nHTTP\/1\.[01] 200/);
    expect(answer).toContain(PAGE);
    expect(answer).not.toContain('the host');
  });

  it('passes bytes both ways and a half-close on', async () => {
    const echoPort = (echo.address() as net.AddressInfo).port;
    const payload = Buffer.alloc(3 * 1024 * 1024, 'x');
    const answer = await exchange(Buffer.concat([Buffer.from(`${await tickets.mint({ sandboxId: 'sbx_self', port: echoPort })}\n`), payload]), { endAfterWrite: true });
    expect(answer.slice(0, 3)).toBe('ok\n');
    expect(answer.length - 3).toBe(payload.length);
  });

  it('refuses, coded, before a byte reaches the port: forged, expired or malformed tickets, a sandbox not running here, a port with nothing on it', async () => {
    const forged = `v1 sbx_netns ${port} ${Date.now() + 30_000} ${'0'.repeat(64)}`;
    expect(refusal(await exchange(`${forged}\n`))).toMatchObject({ code: 'unauthenticated', message: expect.stringMatching(/does not verify/) });
    const expired = await new PortTickets(scratch.redis, () => Date.now() - 120_000).mint({ sandboxId: 'sbx_netns', port });
    expect(refusal(await exchange(`${expired}\n`))).toMatchObject({ code: 'unauthenticated', message: expect.stringMatching(/expired/) });
    expect(refusal(await exchange(`sbx_netns ${port}\n`))).toMatchObject({ code: 'unauthenticated' });
    expect(refusal(await exchange(`${'x'.repeat(300)}\n`))).toMatchObject({ code: 'invalid_request' });
    expect(refusal(await exchange(`${await tickets.mint({ sandboxId: 'sbx_paused', port })}\n`))).toMatchObject({ code: 'invalid_state', message: expect.stringMatching(/paused/) });
    expect(refusal(await exchange(`${await tickets.mint({ sandboxId: 'sbx_gone', port })}\n`))).toMatchObject({ code: 'invalid_state' });
    expect(refusal(await exchange(`${await tickets.mint({ sandboxId: 'sbx_netns', port: port + 1 })}\n`))).toMatchObject({ code: 'port_closed', message: expect.stringContaining(`nothing listens on port ${port + 1} in sandbox sbx_netns`) });
  });

  it('serves many connections at once (more than the connections it keeps ready to the worker)', async () => {
    const ticket = await tickets.mint({ sandboxId: 'sbx_netns', port });
    const answers = await Promise.all(Array.from({ length: 60 }, () => exchange(`${ticket}\nGET /index.html HTTP/1.0\r\n\r\n`)));
    expect(answers.filter((a) => a.startsWith('ok\n') && a.includes(PAGE))).toHaveLength(60);
  });

  it('opens again on the same port when its helper dies, and a connection it relayed ends with it', async () => {
    const echoPort = (echo.address() as net.AddressInfo).port;
    const held = net.connect({ host: '127.0.0.1', port: relayPort });
    held.write(`${await tickets.mint({ sandboxId: 'sbx_self', port: echoPort })}\n`);
    let heldGot = '';
    held.on('data', (chunk: Buffer) => (heldGot += chunk.toString()));
    const heldClosed = new Promise<void>((resolve) => held.once('close', () => resolve()));
    held.on('error', () => undefined);
    await waitFor('the held connection opened', async () => heldGot.startsWith('ok\n'), 5000);
    const helpers = (await fs.readdir('/proc')).filter((p) => /^\d+$/.test(p));
    const listener = (
      await Promise.all(
        helpers.map(async (pid) => {
          const cmdline = await fs.readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
          const ppid = Number((await fs.readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '')).split(') ')[1]?.split(' ')[1]);
          return cmdline.includes('rollbox-portfwd') && cmdline.includes(dir) && ppid === process.pid ? Number(pid) : 0;
        }),
      )
    ).find((pid) => pid > 0);
    expect(listener).toBeGreaterThan(0);
    process.kill(listener!, 'SIGKILL');
    await heldClosed;
    await waitFor('the relay back on its port', async () => (await exchange(`${await tickets.mint({ sandboxId: 'sbx_netns', port })}\nGET /index.html HTTP/1.0\r\n\r\n`).catch(() => '')).includes(PAGE), 5000);
  });
});

import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import net, { type LookupFunction } from 'node:net';
import path from 'node:path';
import { promisify } from 'node:util';
import { Sandbox } from 'e2b';
import { Sandbox as OlderSandbox } from 'e2b-2-45';
import { Agent, WebSocket } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import type { NodeHeartbeat } from '../src/api/index.ts';
import { PortTickets } from '../src/ports/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

/**
 * Traffic into ports of sandboxes (issue 41, point 4) on a real stack: busybox httpd (files,
 * a CGI that reads a streamed body) and a WebSocket echo (Python's standard library, from a
 * layer of this host's python3) in runc sandboxes, reached through rollbox's
 * `/v1/sandboxes/:id/ports/:port/...` and through the real E2B SDK's `getHost(port)` (2.51
 * and 2.45); and the walls: another tenant, a missing or wrong traffic token, a sandbox that
 * does not exist or does not run, a relay without a ticket, a sandbox dialling its host.
 */
const run = promisify(execFile);
const REPO_ROOT = path.resolve(import.meta.dirname, '..');
const HTTP_PORT = 8080;
const WS_PORT = 8081;
const RAW_PORT = 8082;
let cluster: TestCluster;
let owner: string;
let stranger: string;
let apiKey: string;
let sandboxId: string;
const saved: NodeJS.ProcessEnv = { ...process.env };
const opened: { kill(): Promise<unknown> }[] = [];

/** A WebSocket echo server, RFC 6455 by hand: handshake, unmasked echo of each frame, close. */
const WS_ECHO = `
import base64, hashlib, socket, struct, threading
def serve(c):
    f = c.makefile('rb')
    key = ''
    while True:
        line = f.readline()
        if line in (b'\\r\\n', b''): break
        name, _, value = line.decode().partition(':')
        if name.strip().lower() == 'sec-websocket-key': key = value.strip()
    accept = base64.b64encode(hashlib.sha1((key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
    c.sendall(('HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ' + accept + '\\r\\n\\r\\n').encode())
    while True:
        head = f.read(2)
        if len(head) < 2: break
        op, n = head[0] & 15, head[1] & 127
        if n == 126: n = struct.unpack('>H', f.read(2))[0]
        elif n == 127: n = struct.unpack('>Q', f.read(8))[0]
        mask = f.read(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if op == 8:
            c.sendall(b'\\x88\\x00')
            break
        size = bytes([n]) if n < 126 else bytes([126]) + struct.pack('>H', n) if n < 65536 else bytes([127]) + struct.pack('>Q', n)
        c.sendall(bytes([0x80 | op]) + size + data)
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', ${WS_PORT}))
s.listen(16)
while True:
    conn, _ = s.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
`;
/** A CGI of busybox httpd: the method, the query and the sha1 of the body it was sent. */
const CGI = '#!/bin/sh\nprintf "Content-Type: text/plain\\r\\n\\r\\n"\necho "$REQUEST_METHOD $QUERY_STRING"\nhead -c "${CONTENT_LENGTH:-0}" | sha1sum | cut -c1-40\n';

const sha1 = (data: Buffer) => createHash('sha1').update(data).digest('hex');

beforeAll(async () => {
  // The relay on every address of the host, as on a cluster of several machines: the wall test below shows sandboxes still cannot reach it.
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-ports', env: { ROLLBOX_PORT_RELAY_LISTEN: '0.0.0.0:0' } }] });
  owner = await cluster.token('ports-a', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'layer:write']);
  stranger = await cluster.token('ports-b', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
  // Python as Debian ships it, for the WebSocket echo: the interpreter, what it links, its standard library.
  // Not execFileSync: the worker host runs in this process and must keep its heartbeats.
  const { stdout: tar } = await run('tar', ['-C', '/', '-chf', '-', '--exclude=__pycache__', '--exclude=dist-packages', '--exclude=site-packages', '--exclude=test', '--exclude=idlelib', '--exclude=tkinter', '--exclude=ensurepip', '--exclude=pydoc_data', '--exclude=lib2to3', 'usr/bin/python3.11', 'usr/lib/python3.11', 'lib64/ld-linux-x86-64.so.2', ...['libc.so.6', 'libm.so.6', 'libz.so.1', 'libexpat.so.1'].map((l) => `lib/x86_64-linux-gnu/${l}`)], { maxBuffer: 512 * 1024 * 1024, encoding: 'buffer' });
  const layer = await api(cluster, owner, 'POST', '/v1/layers?name=ports-python', new Uint8Array(tar), { 'content-type': 'application/x-tar' });
  expect(layer.status, JSON.stringify(layer.body)).toBe(201);
  const created = await api(cluster, owner, 'POST', '/v1/sandboxes', { image: { base: 'busybox', layers: ['ports-python'] }, resources: { memoryMiB: 128 }, ttlSeconds: 300 });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  sandboxId = created.body.id;
  const big = randomBytes(3 * 1024 * 1024);
  await put(`/www/big.bin`, big);
  await put('/www/index.html', 'hello from the sandbox\n');
  await put('/www/cgi-bin/echo', CGI, '0755');
  await put('/srv/ws.py', WS_ECHO);
  await sh(`httpd -p ${HTTP_PORT} -h /www; /usr/bin/python3.11 -I /srv/ws.py >/tmp/ws.log 2>&1 &`);
  const listening = () => sh(`netstat -ltn | grep -cE ':(${HTTP_PORT}|${WS_PORT}) '`);
  await waitFor('the servers to listen', async () => (await listening()).trim() === '2', 20_000).catch(async (err: Error) => {
    throw new Error(`${err.message}: ${await listening()} ${await sh('cat /tmp/ws.log')}`);
  });
  const issued = await run(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), 'e2b-key', 'issue', '--tenant', 'ports-a'], { env: { ...process.env, REDIS_URL: cluster.redisUrl } });
  apiKey = issued.stdout.trim();
  Object.assign(process.env, { E2B_API_URL: cluster.url, E2B_SANDBOX_URL: cluster.url, E2B_API_KEY: apiKey });
}, 120_000);

afterAll(async () => {
  await Promise.allSettled(opened.map((s) => s.kill()));
  process.env = saved;
  await cluster?.stop();
}, 60_000);

async function put(file: string, body: string | Buffer, mode?: string): Promise<void> {
  const r = await api(cluster, owner, 'PUT', `/v1/sandboxes/${sandboxId}/files?path=${encodeURIComponent(file)}${mode ? `&mode=${mode}` : ''}`, new Uint8Array(Buffer.from(body)), { 'content-type': 'application/octet-stream' });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
}

async function sh(cmd: string): Promise<string> {
  const r = await api(cluster, owner, 'POST', `/v1/sandboxes/${sandboxId}/exec`, { cmd });
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return r.body.stdout as string;
}

/** Names under the E2B domain (`localhost:<port>`) resolve to the gateway's loopback, as a wildcard DNS entry would. */
const lookup: LookupFunction = (_hostname, options, callback) => {
  if ((options as { all?: boolean }).all) (callback as unknown as (err: null, addresses: { address: string; family: number }[]) => void)(null, [{ address: '127.0.0.1', family: 4 }]);
  else callback(null, '127.0.0.1', 4);
};

/** One HTTP request, its answer read whole. */
function request(url: string, options: { method?: string; headers?: Record<string, string>; body?: Buffer } = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: options.method ?? 'GET', headers: options.headers, lookup }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(options.body);
  });
}

const errorCode = (body: Buffer) => (JSON.parse(body.toString()) as { error: { code: string } }).error.code;

/** Sends each message over a WebSocket and collects the echoes. */
async function echoes(url: string, headers: Record<string, string>, messages: (string | Buffer)[]): Promise<(string | Buffer)[]> {
  const ws = new WebSocket(url, { headers, dispatcher: new Agent({ connect: { lookup } }) } as never);
  ws.binaryType = 'arraybuffer';
  const got: (string | Buffer)[] = [];
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no echo within 10 s (got ${got.length})`)), 10_000);
    ws.onerror = (e) => (clearTimeout(timer), reject(new Error(`websocket error: ${String((e as { message?: string }).message ?? e.type)}`)));
    ws.onopen = () => messages.forEach((m) => ws.send(m));
    ws.onmessage = (e) => {
      got.push(typeof e.data === 'string' ? e.data : Buffer.from(e.data as ArrayBuffer));
      if (got.length < messages.length) return;
      clearTimeout(timer);
      ws.close();
      resolve();
    };
  });
  return got;
}

describe("rollbox's /v1/sandboxes/:id/ports/:port/...", () => {
  const portUrl = (port: number, rest: string, id = sandboxId) => `${cluster.url}/v1/sandboxes/${id}/ports/${port}${rest}`;

  it('passes requests of any method to the server in the sandbox, bodies streamed both ways', async () => {
    const page = await request(portUrl(HTTP_PORT, '/index.html'), { headers: { authorization: `Bearer ${owner}` } });
    expect(page.status).toBe(200);
    expect(page.body.toString()).toBe('hello from the sandbox\n');
    const big = await request(portUrl(HTTP_PORT, '/big.bin'), { headers: { authorization: `Bearer ${owner}` } });
    expect(big.status).toBe(200);
    expect(big.body.length).toBe(3 * 1024 * 1024);
    expect(sha1(big.body)).toBe((await sh('sha1sum /www/big.bin')).slice(0, 40));
    const upload = randomBytes(4 * 1024 * 1024 + 7);
    const posted = await request(portUrl(HTTP_PORT, '/cgi-bin/echo?a=1&b=two'), { method: 'POST', headers: { authorization: `Bearer ${owner}`, 'content-type': 'application/octet-stream' }, body: upload });
    expect(posted.status, posted.body.toString()).toBe(200);
    expect(posted.body.toString()).toBe(`POST a=1&b=two\n${sha1(upload)}\n`);
    // The server's own answers come back as they are.
    expect((await request(portUrl(HTTP_PORT, '/missing'), { headers: { authorization: `Bearer ${owner}` } })).status).toBe(404);
  }, 60_000);

  it('keeps the caller\'s token at the gateway and tells the server the port\'s own host', async () => {
    // A one-shot server that records the request it gets. Its answer's pipe stays open long
    // enough for a loaded host: nc closes the connection when its input ends.
    // Every descriptor of the pipeline away from the exec's: it answers at once, not after the sleep.
    await sh(`((printf 'HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok'; sleep 20) | nc -l -p ${RAW_PORT} > /tmp/raw.req) </dev/null >/dev/null 2>&1 &`);
    await waitFor('nc to listen', async () => (await sh(`netstat -ltn | grep -c ':${RAW_PORT} '`)).trim() === '1');
    const r = await request(portUrl(RAW_PORT, '/x/y?z=1'), { method: 'PUT', headers: { authorization: `Bearer ${owner}`, 'x-custom': 'kept' }, body: Buffer.from('body!') });
    expect(r.body.toString()).toBe('ok');
    const seen = await waitFor('the whole request recorded', async () => {
      const text = await sh('cat /tmp/raw.req');
      return text.endsWith('body!') ? text : undefined;
    });
    expect(seen).toMatch(/^PUT \/x\/y\?z=1 HTTP\/1\.1\r\n/);
    expect(seen).toMatch(/\r\nHost: localhost:8082\r\n/i);
    expect(seen).toMatch(/\r\nx-custom: kept\r\n/i);
    expect(seen).toMatch(/body!$/);
    expect(seen.toLowerCase()).not.toContain('authorization');
  });

  it('passes a WebSocket through', async () => {
    const binary = randomBytes(70_000);
    const got = await echoes(portUrl(WS_PORT, '/echo').replace(/^http/, 'ws'), { authorization: `Bearer ${owner}` }, ['hello', binary]);
    expect(got[0]).toBe('hello');
    expect(Buffer.compare(got[1] as Buffer, binary)).toBe(0);
  });

  it("refuses, coded: another tenant's sandbox, no token, a port with nothing on it, no port, a sandbox that does not exist", async () => {
    const other = await request(portUrl(HTTP_PORT, '/index.html'), { headers: { authorization: `Bearer ${stranger}` } });
    expect([other.status, errorCode(other.body)]).toEqual([404, 'not_found']);
    const anonymous = await request(portUrl(HTTP_PORT, '/index.html'));
    expect([anonymous.status, errorCode(anonymous.body)]).toEqual([401, 'unauthenticated']);
    const closed = await request(portUrl(9, '/'), { headers: { authorization: `Bearer ${owner}` } });
    expect([closed.status, errorCode(closed.body)]).toEqual([502, 'port_closed']);
    const bad = await request(portUrl(70000, '/'), { headers: { authorization: `Bearer ${owner}` } });
    expect([bad.status, errorCode(bad.body)]).toEqual([400, 'invalid_request']);
    const missing = await request(portUrl(HTTP_PORT, '/', 'sbx_doesnotexist'), { headers: { authorization: `Bearer ${owner}` } });
    expect([missing.status, errorCode(missing.body)]).toEqual([404, 'not_found']);
    // Another tenant's WebSocket: refused before any byte reaches the sandbox.
    await expect(echoes(portUrl(WS_PORT, '/').replace(/^http/, 'ws'), { authorization: `Bearer ${stranger}` }, ['x'])).rejects.toThrow(/websocket error/);
  });
});

describe("E2B's getHost(port)", () => {
  it('names <port>-<id>.<domain>, which the gateway routes into the port under the traffic token', async () => {
    // The sandbox of the tests above, as the E2B SDK of the same tenant sees it.
    const sbx = await Sandbox.connect(sandboxId);
    const domain = `localhost:${new URL(cluster.url).port}`;
    expect(sbx.getHost(HTTP_PORT)).toBe(`${HTTP_PORT}-${sandboxId}.${domain}`);
    expect(sbx.trafficAccessToken).toBeTruthy();
    const token = { 'e2b-traffic-access-token': sbx.trafficAccessToken! };
    const page = await request(`http://${sbx.getHost(HTTP_PORT)}/index.html`, { headers: token });
    expect([page.status, page.body.toString()]).toEqual([200, 'hello from the sandbox\n']);
    const upload = randomBytes(1024 * 1024);
    const posted = await request(`http://${sbx.getHost(HTTP_PORT)}/cgi-bin/echo?q`, { method: 'POST', headers: { ...token, 'content-type': 'application/octet-stream' }, body: upload });
    expect(posted.body.toString()).toBe(`POST q\n${sha1(upload)}\n`);
    const got = await echoes(`ws://${sbx.getHost(WS_PORT)}/`, token, ['through getHost']);
    expect(got).toEqual(['through getHost']);
    // The oldest SDK still in use names the same host (from connect's domain) and takes the same token.
    const older = await OlderSandbox.connect(sandboxId);
    expect(older.getHost(HTTP_PORT)).toBe(sbx.getHost(HTTP_PORT));
    const viaOlder = await request(`http://${older.getHost(HTTP_PORT)}/index.html`, { headers: { 'e2b-traffic-access-token': older.trafficAccessToken! } });
    expect([viaOlder.status, viaOlder.body.toString()]).toEqual([200, 'hello from the sandbox\n']);
  }, 60_000);

  it('refuses, coded: no token, a wrong one, another sandbox\'s, a host naming no sandbox; a public sandbox takes traffic without one', async () => {
    const sbx = await Sandbox.connect(sandboxId);
    const url = `http://${sbx.getHost(HTTP_PORT)}/index.html`;
    const none = await request(url);
    expect([none.status, errorCode(none.body)]).toEqual([403, 'forbidden']);
    const wrong = await request(url, { headers: { 'e2b-traffic-access-token': `${sbx.trafficAccessToken!.slice(0, -4)}0000` } });
    expect([wrong.status, errorCode(wrong.body)]).toEqual([403, 'forbidden']);
    const publicOne = await Sandbox.create('busybox', { network: { allowPublicTraffic: true } });
    opened.push(publicOne);
    expect(publicOne.trafficAccessToken).toBeUndefined();
    const privateOne = await Sandbox.create('busybox');
    opened.push(privateOne);
    const borrowed = await request(url, { headers: { 'e2b-traffic-access-token': privateOne.trafficAccessToken! } });
    expect([borrowed.status, errorCode(borrowed.body)]).toEqual([403, 'forbidden']);
    const nowhere = await request(`http://${HTTP_PORT}-sbx_doesnotexist.localhost:${new URL(cluster.url).port}/`, { headers: { 'e2b-traffic-access-token': sbx.trafficAccessToken! } });
    expect([nowhere.status, errorCode(nowhere.body)]).toEqual([404, 'not_found']);
    await publicOne.commands.run(`mkdir -p /www && echo public > /www/index.html && httpd -p ${HTTP_PORT} -h /www`);
    const open = await request(`http://${publicOne.getHost(HTTP_PORT)}/index.html`);
    expect([open.status, open.body.toString()]).toEqual([200, 'public\n']);
  }, 60_000);
});

describe('a sandbox that does not run', () => {
  it('answers invalid_state while paused (both ways in), takes traffic again once resumed, and, deleted, not_found by its E2B name (invalid_state by the rollbox path)', async () => {
    const sbx = await Sandbox.connect(sandboxId);
    const token = { 'e2b-traffic-access-token': sbx.trafficAccessToken! };
    const viaRollbox = `${cluster.url}/v1/sandboxes/${sandboxId}/ports/${HTTP_PORT}/index.html`;
    const viaE2b = `http://${sbx.getHost(HTTP_PORT)}/index.html`;
    // Served just before: the gateway routes by the record it keeps for 2 s, and the host's relay refuses the paused sandbox.
    expect((await request(viaRollbox, { headers: { authorization: `Bearer ${owner}` } })).status).toBe(200);
    const paused = await api(cluster, owner, 'POST', `/v1/sandboxes/${sandboxId}/pause`);
    expect(paused.status, JSON.stringify(paused.body)).toBe(200);
    const rollboxAnswer = await request(viaRollbox, { headers: { authorization: `Bearer ${owner}` } });
    expect([rollboxAnswer.status, errorCode(rollboxAnswer.body)]).toEqual([409, 'invalid_state']);
    expect(JSON.parse(rollboxAnswer.body.toString()).error.message).toMatch(/paused/);
    const e2bAnswer = await request(viaE2b, { headers: token });
    expect([e2bAnswer.status, errorCode(e2bAnswer.body)]).toEqual([409, 'invalid_state']);
    const resumed = await api(cluster, owner, 'POST', `/v1/sandboxes/${sandboxId}/resume`);
    expect(resumed.status, JSON.stringify(resumed.body)).toBe(200);
    const again = await request(viaE2b, { headers: token });
    expect([again.status, again.body.toString()]).toEqual([200, 'hello from the sandbox\n']);

    // A sandbox that ran a server and was deleted: its name leads nowhere.
    const gone = await Sandbox.create('busybox');
    await gone.commands.run(`mkdir -p /www && echo bye > /www/index.html && httpd -p ${HTTP_PORT} -h /www`);
    const goneHost = `http://${gone.getHost(HTTP_PORT)}/index.html`;
    const goneToken = { 'e2b-traffic-access-token': gone.trafficAccessToken! };
    expect((await request(goneHost, { headers: goneToken })).body.toString()).toBe('bye\n');
    await gone.kill();
    const afterKill = await request(goneHost, { headers: goneToken });
    expect([afterKill.status, errorCode(afterKill.body)]).toEqual([404, 'not_found']);
    const afterKillRollbox = await request(`${cluster.url}/v1/sandboxes/${gone.sandboxId}/ports/${HTTP_PORT}/index.html`, { headers: { authorization: `Bearer ${owner}` } });
    // rollbox keeps an ended sandbox's record (GET answers it): its ports are not running.
    expect([afterKillRollbox.status, errorCode(afterKillRollbox.body)]).toEqual([409, 'invalid_state']);
  }, 60_000);
});

describe('the port relay of a worker host', () => {
  /** What a relay answers to `line`, up to its first line's end. */
  const relayAnswer = (port: number, line: string) =>
    new Promise<string>((resolve, reject) => {
      const socket = net.connect({ host: '127.0.0.1', port }, () => socket.write(`${line}\n`));
      let got = '';
      socket.on('data', (chunk: Buffer) => {
        got += chunk.toString();
        if (got.includes('\n')) socket.destroy();
      });
      socket.once('close', () => resolve(got));
      socket.once('error', reject);
      socket.setTimeout(10_000, () => socket.destroy(new Error('no answer')));
    });

  it('opens nothing without a ticket a gateway signed, and sandboxes cannot reach it (nor the gateway) on their host', async () => {
    const admin = await cluster.token('ports-admin', ['admin']);
    const nodes = await api<{ nodes: NodeHeartbeat[] }>(cluster, admin, 'GET', '/v1/nodes');
    const relay = nodes.body.nodes.find((n) => n.nodeId === 'node-ports')?.portRelay;
    expect(relay).toMatch(/^0\.0\.0\.0:\d+$/);
    const relayPort = Number(relay!.split(':')[1]);
    const forged = await relayAnswer(relayPort, `v1 ${sandboxId} ${HTTP_PORT} ${Date.now() + 30_000} ${'0'.repeat(64)}`);
    expect(JSON.parse(forged.replace(/^err /, ''))).toMatchObject({ code: 'unauthenticated' });
    expect(JSON.parse((await relayAnswer(relayPort, `${sandboxId} ${HTTP_PORT}`)).replace(/^err /, ''))).toMatchObject({ code: 'unauthenticated' });
    // A ticket signed under the cluster's secret opens the port; the same, minted two minutes ago, has expired.
    const redis = new Redis(cluster.redisUrl);
    try {
      expect(await relayAnswer(relayPort, await new PortTickets(redis).mint({ sandboxId, port: HTTP_PORT }))).toMatch(/^ok\n/);
      const stale = await new PortTickets(redis, () => Date.now() - 120_000).mint({ sandboxId, port: HTTP_PORT });
      expect(JSON.parse((await relayAnswer(relayPort, stale)).replace(/^err /, ''))).toMatchObject({ code: 'unauthenticated', message: expect.stringMatching(/expired/) });
    } finally {
      redis.disconnect();
    }

    // A sandbox with a network: its host's addresses (the veth's host end included) are walled off.
    const created = await api(cluster, owner, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ttlSeconds: 120, network: { mode: 'allowlist', allow: [{ cidr: '192.0.2.0/24' }] } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    try {
      const gatewayPort = new URL(cluster.url).port;
      const tried = await api(cluster, owner, 'POST', `/v1/sandboxes/${id}/exec`, {
        cmd: `gw=$(route -n | awk '$1=="0.0.0.0"{print $2}'); echo "gw=$gw"; for p in ${relayPort} ${gatewayPort}; do if echo | nc -w 3 "$gw" $p; then echo "reached $p"; else echo "refused $p"; fi; done`,
        timeoutMs: 30_000,
      });
      expect(tried.status, JSON.stringify(tried.body)).toBe(200);
      const out = tried.body.stdout as string;
      expect(out).toMatch(/^gw=\d+\.\d+\.\d+\.\d+$/m);
      expect(out).toContain(`refused ${relayPort}`);
      expect(out).toContain(`refused ${gatewayPort}`);
      expect(out).not.toContain('reached');
    } finally {
      await api(cluster, owner, 'DELETE', `/v1/sandboxes/${id}`);
    }
  }, 60_000);

  it("lets a sandbox that reaches the gateway (network.gateway) into another sandbox's port only with its credentials", async () => {
    const gatewayPort = new URL(cluster.url).port;
    const token = (await Sandbox.connect(sandboxId)).trafficAccessToken!;
    const created = await api(cluster, stranger, 'POST', '/v1/sandboxes', { resources: { memoryMiB: 64 }, ttlSeconds: 120, network: { gateway: true } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const id = created.body.id as string;
    try {
      const fetchFrom = async (args: string) => {
        const r = await api(cluster, stranger, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: `wget -q -O- ${args} 2>&1; echo " rc=$?"`, timeoutMs: 30_000 });
        expect(r.status, JSON.stringify(r.body)).toBe(200);
        return r.body.stdout as string;
      };
      const byName = `--header 'Host: ${HTTP_PORT}-${sandboxId}.localhost:${gatewayPort}' http://gateway.rollbox.internal:9180/index.html`;
      // Through the gateway, the E2B name without the traffic token, and rollbox's path without a token: refused.
      expect(await fetchFrom(byName)).toMatch(/403 Forbidden.* rc=1/s);
      expect(await fetchFrom(`http://gateway.rollbox.internal:9180/v1/sandboxes/${sandboxId}/ports/${HTTP_PORT}/index.html`)).toMatch(/401 Unauthorized.* rc=1/s);
      // With the token, the same request passes: the wall above is the gateway's, not the network's.
      expect(await fetchFrom(`--header 'e2b-traffic-access-token: ${token}' ${byName}`)).toBe('hello from the sandbox\n rc=0\n');
    } finally {
      await api(cluster, stranger, 'DELETE', `/v1/sandboxes/${id}`);
    }
  }, 60_000);
});

/**
 * A real OCI registry for tests: Debian's `docker-registry` (distribution 2.8.2) serving
 * a temp dir on a free loopback port, anonymous, with htpasswd (Basic) auth, or with
 * token auth (a certificate made here and a small token server issuing ES256 JWTs with
 * the certificate in `x5c`, as the registry's `auth: token` verifies them). Images go in
 * with `skopeo copy` from OCI layouts built by ./oci.ts. The registry's access log tells
 * which requests it served; `stop()` ends it by pid. Also a loopback proxy that counts,
 * slows and cuts requests (for registries that go away mid-pull).
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import bcrypt from 'bcryptjs';
import { SignJWT, importPKCS8 } from 'jose';

const run = promisify(execFile);

export type RegistryAuth = { kind: 'none' } | { kind: 'htpasswd'; users: Record<string, string> } | { kind: 'token'; users: Record<string, string>; tokenSeconds?: number };

export interface ServedRequest {
  method: string;
  path: string;
  status: number;
}

export interface TestRegistry {
  /** `127.0.0.1:PORT`: what refs and auth files name. */
  host: string;
  url: string;
  dir: string;
  auth: RegistryAuth;
  /** Requests the registry answered (from its access log), in order. */
  served: ServedRequest[];
  /** Token auth: the token server's `host:port` (its realm's). */
  tokenHost?: string;
  /** Token requests the token server answered (token auth): status and whether they carried credentials. */
  tokenRequests: { status: number; withCredentials: boolean }[];
  /** Pushes an OCI layout (a tar from ./oci.ts, or a path to one) as `repo:tag`; `all`: every image of an index (a multi-platform image). */
  push(layoutTar: Buffer | string, repoTag: string, options?: { all?: boolean }): Promise<void>;
  /** Where the registry keeps a blob's bytes. */
  blobFile(digest: string): string;
  /** Ends the registry now (SIGKILL), as a crash would. */
  kill(): Promise<void>;
  /** Starts it again on the same port and storage. */
  start(): Promise<void>;
  stop(): Promise<void>;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

const ACCESS_LINE = /"([A-Z]+) (\S+) HTTP\/[\d.]+" (\d{3}) /;

export async function startTestRegistry(auth: RegistryAuth = { kind: 'none' }): Promise<TestRegistry> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-registry-'));
  const port = await freePort();
  const host = `127.0.0.1:${port}`;
  const served: ServedRequest[] = [];
  const tokenRequests: TestRegistry['tokenRequests'] = [];
  let tokenServer: http.Server | undefined;
  let tokenHost: string | undefined;
  let authYaml = '';
  if (auth.kind === 'htpasswd') {
    const lines = Object.entries(auth.users).map(([user, password]) => `${user}:${bcrypt.hashSync(password, 5)}`);
    await fs.writeFile(path.join(dir, 'htpasswd'), `${lines.join('\n')}\n`);
    authYaml = `auth:\n  htpasswd:\n    realm: rollbox-test\n    path: ${dir}/htpasswd\n`;
  } else if (auth.kind === 'token') {
    const started = await startTokenServer(dir, auth, tokenRequests);
    tokenServer = started.server;
    tokenHost = new URL(started.realm).host;
    authYaml = `auth:\n  token:\n    realm: ${started.realm}\n    service: rollbox-test\n    issuer: rollbox-test-issuer\n    rootcertbundle: ${dir}/token.crt\n`;
  }
  const config = `version: 0.1
log:
  level: error
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: ${dir}/data
  delete:
    enabled: true
http:
  addr: ${host}
  secret: rollbox-test-${randomBytes(8).toString('hex')}
${authYaml}`;
  await fs.writeFile(path.join(dir, 'config.yml'), config);

  let child: ChildProcess | undefined;
  const start = async (): Promise<void> => {
    const proc = spawn('docker-registry', ['serve', path.join(dir, 'config.yml')], { stdio: ['ignore', 'pipe', 'pipe'] });
    child = proc;
    let log = '';
    const onData = (d: Buffer): void => {
      log += d.toString();
      let nl: number;
      while ((nl = log.indexOf('\n')) >= 0) {
        const m = ACCESS_LINE.exec(log.slice(0, nl));
        log = log.slice(nl + 1);
        if (m) served.push({ method: m[1]!, path: m[2]!, status: Number(m[3]) });
      }
    };
    proc.stdout!.on('data', onData);
    proc.stderr!.on('data', onData);
    const deadline = Date.now() + 15_000;
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`docker-registry exited ${proc.exitCode}: ${log.slice(-500)}`);
      const up = await fetch(`http://${host}/v2/`).then((r) => r.status === 200 || r.status === 401, () => false);
      if (up) break;
      if (Date.now() > deadline) throw new Error('docker-registry did not start');
      await new Promise((r) => setTimeout(r, 50));
    }
    served.length = 0;
  };
  const end = async (signal: NodeJS.Signals): Promise<void> => {
    const proc = child;
    child = undefined;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise((r) => proc.once('exit', r));
    proc.kill(signal);
    await exited;
  };
  const creds = auth.kind === 'none' ? [] : (() => {
    const [user, password] = Object.entries(auth.users)[0]!;
    return ['--dest-creds', `${user}:${password}`];
  })();
  try {
    await start();
  } catch (err) {
    tokenServer?.close();
    await fs.rm(dir, { recursive: true, force: true });
    throw err;
  }
  return {
    host,
    url: `http://${host}`,
    dir,
    auth,
    served,
    ...(tokenHost ? { tokenHost } : {}),
    tokenRequests,
    async push(layoutTar, repoTag, options = {}) {
      const file = typeof layoutTar === 'string' ? layoutTar : path.join(dir, `push-${randomBytes(4).toString('hex')}.tar`);
      if (typeof layoutTar !== 'string') await fs.writeFile(file, layoutTar);
      try {
        await run('skopeo', ['copy', '--quiet', ...(options.all ? ['--all'] : []), '--dest-tls-verify=false', ...creds, `oci-archive:${file}`, `docker://${host}/${repoTag}`], { timeout: 600_000 });
      } finally {
        if (file !== layoutTar) await fs.rm(file, { force: true });
      }
    },
    blobFile: (digest) => {
      const hex = digest.replace(/^sha256:/, '');
      return path.join(dir, 'data/docker/registry/v2/blobs/sha256', hex.slice(0, 2), hex, 'data');
    },
    kill: () => end('SIGKILL'),
    start,
    async stop() {
      await end('SIGTERM');
      await new Promise((r) => (tokenServer ? tokenServer.close(r) : r(undefined)));
      await fs.rm(dir, { recursive: true, force: true });
    },
  };
}

/** A token server as `auth: token` expects: Basic credentials in, an ES256 JWT signed by a key whose certificate the registry trusts. */
async function startTokenServer(dir: string, auth: Extract<RegistryAuth, { kind: 'token' }>, log: TestRegistry['tokenRequests']): Promise<{ server: http.Server; realm: string }> {
  const key = path.join(dir, 'token.key');
  const crt = path.join(dir, 'token.crt');
  await run('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key, '-out', crt, '-days', '2', '-subj', '/CN=rollbox-test-token']);
  const pem = await fs.readFile(crt, 'utf8');
  const certDer = pem.replace(/-----(BEGIN|END) CERTIFICATE-----|\s/g, '');
  const signingKey = await importPKCS8(await fs.readFile(key, 'utf8'), 'ES256');
  const server = http.createServer((req, res) => {
    void (async () => {
      const url = new URL(req.url ?? '/', 'http://x');
      const basic = /^Basic (.+)$/.exec(req.headers.authorization ?? '')?.[1];
      const [user, password] = basic ? (Buffer.from(basic, 'base64').toString().split(/:(.*)/s) as [string, string]) : [];
      const ok = user !== undefined && auth.users[user] === password;
      log.push({ status: ok ? 200 : 401, withCredentials: basic !== undefined });
      if (!ok) {
        res.writeHead(401, { 'content-type': 'application/json' }).end('{"details":"wrong credentials"}');
        return;
      }
      const access = url.searchParams.getAll('scope').flatMap((scope) => {
        const [type, name, actions] = scope.split(':');
        return type && name && actions ? [{ type, name, actions: actions.split(',') }] : [];
      });
      const now = Math.floor(Date.now() / 1000);
      const seconds = auth.tokenSeconds ?? 300;
      const token = await new SignJWT({ access })
        .setProtectedHeader({ alg: 'ES256', typ: 'JWT', x5c: [certDer] })
        .setIssuer('rollbox-test-issuer')
        .setSubject(user)
        .setAudience(url.searchParams.get('service') ?? '')
        .setIssuedAt(now)
        .setNotBefore(now - 5)
        .setExpirationTime(now + seconds)
        .setJti(randomBytes(8).toString('hex'))
        .sign(signingKey);
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token, expires_in: seconds, issued_at: new Date(now * 1000).toISOString() }));
    })();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return { server, realm: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/token` };
}

export interface RegistryProxy {
  host: string;
  url: string;
  /** Requests passed on: method, path and the status the registry answered. */
  requests: ServedRequest[];
  /** Blob body bytes passed to clients so far. */
  bytes: number;
  /** Bytes per second passed on, per response (0: as fast as they come). */
  setRate(bytesPerSecond: number): void;
  stop(): Promise<void>;
}

/** A loopback HTTP proxy in front of a registry: counts requests, can slow responses; an upstream that dies cuts its clients off. */
export async function startRegistryProxy(target: string, options: { bytesPerSecond?: number } = {}): Promise<RegistryProxy> {
  const upstream = new URL(target);
  let rate = options.bytesPerSecond ?? 0;
  const requests: ServedRequest[] = [];
  const state = { bytes: 0 };
  const server = http.createServer((req, res) => {
    const forward = http.request({ host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: { ...req.headers, host: upstream.host } }, (up) => {
      requests.push({ method: req.method ?? '', path: req.url ?? '', status: up.statusCode ?? 0 });
      const headers = { ...up.headers };
      if (headers.location) headers.location = headers.location.replace(upstream.origin, `http://${req.headers.host}`);
      res.writeHead(up.statusCode ?? 502, headers);
      const startedAt = Date.now();
      let sent = 0;
      // Paused by the client's backpressure, by the rate, or both: resumed when neither holds it.
      let full = false;
      let waiting = false;
      const resume = (): void => {
        if (!full && !waiting) up.resume();
      };
      up.on('data', (chunk: Buffer) => {
        sent += chunk.length;
        state.bytes += chunk.length;
        if (!res.write(chunk)) {
          full = true;
          up.pause();
        }
        const aheadMs = rate > 0 ? (sent / rate) * 1000 - (Date.now() - startedAt) : 0;
        if (aheadMs > 5) {
          waiting = true;
          up.pause();
          setTimeout(() => {
            waiting = false;
            resume();
          }, aheadMs);
        }
      });
      res.on('drain', () => {
        full = false;
        resume();
      });
      up.on('end', () => res.end());
      up.on('error', () => res.destroy());
      up.on('aborted', () => res.destroy());
    });
    forward.on('error', () => res.destroy());
    req.pipe(forward);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const host = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  return {
    host,
    url: `http://${host}`,
    requests,
    get bytes() {
      return state.bytes;
    },
    setRate: (bytesPerSecond) => void (rate = bytesPerSecond),
    stop: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

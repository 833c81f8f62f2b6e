/**
 * A registry that lies, for tests: a loopback HTTP server speaking just enough of the OCI
 * distribution API (`/v2/`, manifests by tag or digest, blobs by digest) to serve images
 * built byte by byte by the test (crafted configs, sizes, blobs), and any path answered by a
 * handler of the test's instead (redirects, token challenges, trickled bodies or headers,
 * oversized answers). Every trickle stops when its client goes; `stop()` cuts every
 * connection and closes the server.
 */
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { digestOf } from './oci.ts';

export type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void;

export interface HostileRegistry {
  /** `127.0.0.1:PORT`. */
  host: string;
  url: string;
  /** Paths asked, in order. */
  requests: string[];
  /** Serves `manifest` as `repo:tag` (and by its digest) with `mediaType`, and each blob by its digest. */
  image(repo: string, tag: string, parts: { manifest: Buffer; mediaType?: string; blobs?: Buffer[] }): void;
  /** Serves a blob by its digest. */
  blob(repo: string, bytes: Buffer, contentType?: string): void;
  /** Answers `path` (exact, without the query) with `handler` instead of anything else (undefined: as before). */
  on(path: string, handler: Handler | undefined): void;
  stop(): Promise<void>;
}

/** Writes `bytes` one byte every `everyMs` (a registry trickling), until done or the client goes. */
export function trickle(res: http.ServerResponse | Socket, bytes: Buffer, everyMs: number): void {
  let i = 0;
  const timer = setInterval(() => {
    if (i >= bytes.length) {
      clearInterval(timer);
      return void res.end();
    }
    res.write(bytes.subarray(i, ++i));
  }, everyMs);
  res.once('close', () => clearInterval(timer));
}

export async function startHostileRegistry(): Promise<HostileRegistry> {
  const routes = new Map<string, Handler>();
  const requests: string[] = [];
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0]!;
    requests.push(path);
    const handler = routes.get(path) ?? (path === '/v2/' ? (_q: http.IncomingMessage, r: http.ServerResponse) => void r.writeHead(200, { 'content-type': 'application/json' }).end('{}') : undefined);
    if (handler) return handler(req, res);
    res.writeHead(404, { 'content-type': 'application/json' }).end('{"errors":[{"code":"NAME_UNKNOWN","message":"no such path"}]}');
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  const serve = (path: string, bytes: Buffer, contentType: string): void =>
    void routes.set(path, (_req, res) => void res.writeHead(200, { 'content-type': contentType, 'content-length': bytes.length, 'docker-content-digest': digestOf(bytes) }).end(bytes));
  const registry: HostileRegistry = {
    host,
    url: `http://${host}`,
    requests,
    image(repo, tag, { manifest, mediaType, blobs = [] }) {
      const type = mediaType ?? (JSON.parse(manifest.toString()) as { mediaType?: string }).mediaType ?? 'application/vnd.oci.image.manifest.v1+json';
      serve(`/v2/${repo}/manifests/${tag}`, manifest, type);
      serve(`/v2/${repo}/manifests/${digestOf(manifest)}`, manifest, type);
      for (const b of blobs) registry.blob(repo, b);
    },
    blob(repo, bytes, contentType = 'application/octet-stream') {
      serve(`/v2/${repo}/blobs/${digestOf(bytes)}`, bytes, contentType);
    },
    on(path, handler) {
      if (handler) routes.set(path, handler);
      else routes.delete(path);
    },
    async stop() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  return registry;
}

import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { Transform } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';

/** Which of a layer's files a request was for. */
export type LayerFileKind = 'blob' | 'meta' | 'chunks' | 'other';

/** A link of capped bandwidth that several proxies may share: each chunk leaves once the ones before it had their time on the wire. */
export class ThrottledLink {
  private freeAtMs = 0;

  constructor(public bytesPerSecond = 0) {}

  async pace(bytes: number): Promise<void> {
    if (!this.bytesPerSecond) return;
    const now = performance.now();
    const start = Math.max(now, this.freeAtMs);
    this.freeAtMs = start + (bytes * 1000) / this.bytesPerSecond;
    if (this.freeAtMs - now > 1) await sleep(this.freeAtMs - now);
  }
}

export interface OriginProxyOptions {
  /** The link response bodies go over (default: a link of its own, uncapped until `bytesPerSecond` is set). */
  link?: ThrottledLink;
  /** Added before each request is forwarded (a remote store's latency). */
  delayMs?: number;
}

/**
 * A stand-in for the remote origin of a worker host that lacks the layer store: an HTTP
 * proxy in front of a gateway that counts the bytes it serves by layer file, can be stopped
 * and started again on the same port (the origin gone), can change response bytes
 * (corruption), and can cap bandwidth and add latency (the bench's remote store).
 */
export class OriginProxy {
  private server: http.Server | undefined;
  private readonly sockets = new Set<Socket>();
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  readonly link: ThrottledLink;
  port = 0;
  bytes: Record<LayerFileKind, number> = { blob: 0, meta: 0, chunks: 0, other: 0 };
  requests: Record<LayerFileKind, number> = { blob: 0, meta: 0, chunks: 0, other: 0 };
  /** Changes a response body's bytes on the way (for blob responses: the byte offset in the body). */
  corrupt: ((kind: LayerFileKind, chunk: Buffer) => Buffer) | undefined;
  /** Answers a request itself instead of forwarding it (a hostile origin): true when it did. */
  answer: ((kind: LayerFileKind, req: http.IncomingMessage, res: http.ServerResponse) => boolean) | undefined;

  constructor(
    private readonly target: string,
    readonly options: OriginProxyOptions = {},
  ) {
    this.link = options.link ?? new ThrottledLink();
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get totalBytes(): number {
    return this.bytes.blob + this.bytes.meta + this.bytes.chunks + this.bytes.other;
  }

  /** From now on every blob body (past its first 100 bytes) has one byte flipped: a corrupted origin. */
  corruptBlobs(): void {
    this.corrupt = (kind, chunk) => {
      if (kind !== 'blob' || chunk.length < 100) return chunk;
      const out = Buffer.from(chunk);
      out[50] = out[50]! ^ 0xff;
      return out;
    };
  }

  reset(): void {
    for (const k of Object.keys(this.bytes) as LayerFileKind[]) this.bytes[k] = this.requests[k] = 0;
  }

  async start(): Promise<this> {
    const target = new URL(this.target);
    const server = http.createServer((req, res) => void this.forward(req, res, target));
    server.on('connection', (s) => {
      this.sockets.add(s);
      s.once('close', () => this.sockets.delete(s));
    });
    await new Promise<void>((resolve) => server.listen(this.port, '127.0.0.1', () => resolve()));
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
    return this;
  }

  /** The origin goes away: the listener closes and every open connection is cut. */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const s of this.sockets) s.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  close(): Promise<void> {
    this.agent.destroy();
    return this.stop();
  }

  private async forward(req: http.IncomingMessage, res: http.ServerResponse, target: URL): Promise<void> {
    const kind: LayerFileKind = /\/v1\/layers\/[^/]+\/(blob|meta|chunks)$/.exec(req.url ?? '')?.[1] as LayerFileKind | undefined ?? 'other';
    this.requests[kind]++;
    if (this.answer?.(kind, req, res)) return;
    if (this.options.delayMs) await sleep(this.options.delayMs);
    const upstream = http.request({ host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers, agent: this.agent }, (up) => {
      res.writeHead(up.statusCode ?? 502, up.headers);
      const meter = new Transform({
        transform: (chunk: Buffer, _enc, done) => {
          this.bytes[kind] += chunk.length;
          const out = this.corrupt ? this.corrupt(kind, chunk) : chunk;
          void this.link.pace(out.length).then(() => done(null, out));
        },
      });
      up.pipe(meter).pipe(res);
      up.on('error', () => res.destroy());
    });
    upstream.on('error', () => res.destroy());
    req.pipe(upstream);
  }
}

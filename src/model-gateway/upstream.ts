import http, { type IncomingMessage } from 'node:http';
import https from 'node:https';
import type { ModelUpstream } from '../api/index.ts';
import type { StoredBinding } from './bindings.ts';

/** Statuses that mean "this upstream cannot answer now" (the call is tried elsewhere, or held), not "this request is wrong". */
export const UNAVAILABLE_STATUSES: ReadonlySet<number> = new Set([408, 429, 502, 503, 504, 529]);

/** Headers of the agent's request that go upstream (API versions and betas); its key never does. */
const FORWARDED = /^(anthropic-version|anthropic-beta|openai-beta)$/i;

export interface UpstreamAnswer {
  status: number;
  contentType: string;
  body: IncomingMessage;
}

/** The agent's headers that are forwarded. */
export function forwardedHeaders(headers: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  headers.forEach((value, name) => {
    if (FORWARDED.test(name)) out[name.toLowerCase()] = value;
  });
  return out;
}

/**
 * The job's upstreams, as this gateway uses them: calls spread by fewest in flight per
 * unit of weight (ties in turn), an upstream that failed passed over for a while (tried
 * last, not never: when all are down the first held call probes them in that order), and
 * kept-alive connections, so a call costs no new TCP handshake.
 */
export class Upstreams {
  private readonly agents = { http: new http.Agent({ keepAlive: true, maxSockets: 1024 }), https: new https.Agent({ keepAlive: true, maxSockets: 1024 }) };
  private readonly inflight = new Map<string, number>();
  private readonly downUntil = new Map<string, number>();
  private turn = 0;

  constructor(private readonly options: { connectTimeoutMs: number; idleTimeoutMs: number; now?: () => number }) {}

  /** The binding's upstreams in the order to try them for one call. */
  order(binding: StoredBinding): ModelUpstream[] {
    const now = (this.options.now ?? Date.now)();
    const start = this.turn++;
    return binding.upstreams
      .map((upstream, i) => ({ upstream, down: (this.downUntil.get(upstream.baseUrl) ?? 0) > now, load: (this.inflight.get(upstream.baseUrl) ?? 0) / upstream.weight, spin: (i + start) % binding.upstreams.length }))
      .sort((a, b) => Number(a.down) - Number(b.down) || a.load - b.load || a.spin - b.spin)
      .map((c) => c.upstream);
  }

  markDown(upstream: ModelUpstream, forMs: number): void {
    this.downUntil.set(upstream.baseUrl, (this.options.now ?? Date.now)() + forMs);
  }

  markUp(upstream: ModelUpstream): void {
    this.downUntil.delete(upstream.baseUrl);
  }

  /**
   * One request; rejects when no answer came (refused, reset, no connection within the
   * connect timeout, silent past the idle timeout). The caller must read or destroy `body`.
   */
  request(upstream: ModelUpstream, binding: StoredBinding, input: { method: 'GET' | 'POST'; path: string; body?: string; headers: Record<string, string>; accept: string; onSent?: () => void }): Promise<UpstreamAnswer> {
    const url = new URL(upstream.baseUrl.replace(/\/+$/, '') + input.path);
    const client = url.protocol === 'https:' ? https : http;
    const headers: Record<string, string> = {
      accept: input.accept,
      'user-agent': 'rollbox-model-gateway',
      ...input.headers,
      ...binding.headers,
      ...upstream.headers,
      ...(input.body !== undefined ? { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(input.body)) } : {}),
    };
    this.inflight.set(upstream.baseUrl, (this.inflight.get(upstream.baseUrl) ?? 0) + 1);
    const done = () => this.inflight.set(upstream.baseUrl, Math.max(0, (this.inflight.get(upstream.baseUrl) ?? 1) - 1));
    return new Promise<UpstreamAnswer>((resolve, reject) => {
      const req = client.request(url, { method: input.method, headers, agent: url.protocol === 'https:' ? this.agents.https : this.agents.http });
      let connectTimer: NodeJS.Timeout | undefined;
      req.on('socket', (socket) => {
        if (!socket.connecting) return;
        connectTimer = setTimeout(() => req.destroy(new Error(`no connection within ${this.options.connectTimeoutMs} ms`)), this.options.connectTimeoutMs);
        socket.once('connect', () => clearTimeout(connectTimer));
      });
      req.setTimeout(this.options.idleTimeoutMs, () => req.destroy(new Error(`upstream silent for ${this.options.idleTimeoutMs} ms`)));
      req.on('response', (res) => {
        clearTimeout(connectTimer);
        res.once('close', done);
        resolve({ status: res.statusCode ?? 502, contentType: String(res.headers['content-type'] ?? ''), body: res });
      });
      req.on('error', (err) => {
        clearTimeout(connectTimer);
        done();
        reject(err);
      });
      if (input.onSent) req.once('finish', input.onSent);
      req.end(input.body);
    });
  }

  close(): void {
    this.agents.http.destroy();
    this.agents.https.destroy();
  }
}

/** A whole body as text, at most `maxBytes` (an error answer, a count_tokens reply). */
export async function readAll(body: IncomingMessage, maxBytes = 1 << 20): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += (chunk as Buffer).length;
    if (size > maxBytes) {
      body.destroy();
      break;
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

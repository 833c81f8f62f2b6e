import http from 'node:http';
import net from 'node:net';
import { Duplex } from 'node:stream';
import { RollboxError, isErrorCode } from '../api/index.ts';
import { readLine } from './forwarder.ts';
import type { PortTarget, PortTickets } from './tickets.ts';

const RELAY_CONNECT_TIMEOUT_MS = 5000;
/** The relay's answer: it verifies the ticket and connects on the sandbox's loopback. */
const RELAY_ANSWER_TIMEOUT_MS = 15_000;
const MAX_RELAY_ANSWER_BYTES = 4096;
/** How long a server in a sandbox may take to start its answer (a body may then stream for as long as it likes). */
const RESPONSE_HEAD_TIMEOUT_MS = 300_000;

/** Headers of one hop only (RFC 9110 7.6.1), never passed on; `upgrade` and `connection` pass on an upgrade. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** Where one request goes in the sandbox, and what of it stays behind. */
export interface Forwarding {
  /** Path and query as the sandbox's server sees them. */
  path: string;
  /** The Host header it sees. */
  host: string;
  /** Request headers that are the gateway's, not the server's (lower case): a rollbox token, a traffic token. */
  drop: ReadonlySet<string>;
}

export interface PortProxyDeps {
  tickets: Pick<PortTickets, 'mint'>;
  /** The port relay address (`host:port`) of a worker host, from its heartbeat; undefined when it reports none. */
  relayOf: (nodeId: string) => string | undefined;
}

/**
 * The gateway's side of the port proxy: HTTP requests (any method, bodies streamed both
 * ways) and upgrades (WebSocket) into a port of a sandbox, through the port relay of the
 * worker host that runs it (relay.ts), whichever host that is. The caller has checked
 * that the request may reach the sandbox (its tenant, or its traffic token) and that it runs.
 * Each request gets its own connection: no connection of one caller is ever reused for another.
 */
export class PortProxy {
  constructor(private readonly deps: PortProxyDeps) {}

  /**
   * A byte stream to the port. The ticket goes first and what the caller writes follows it at
   * once, without waiting for the relay's answer (a round trip between gateway and worker host
   * less per request); reads start after the relay's `ok`. `answered` settles with that
   * answer: a refusal (`port_closed`, `invalid_state`...) rejects it and ends the stream with
   * the same coded error, before the caller has read a byte.
   */
  async connect(nodeId: string, target: PortTarget): Promise<{ stream: Duplex; answered: Promise<void> }> {
    const address = this.deps.relayOf(nodeId);
    const m = address && /^\[?([^\]]+)\]?:(\d+)$/.exec(address);
    if (!m) throw new RollboxError('unavailable', `worker host ${nodeId} reports no port relay (an older worker, or it is gone)`, 5);
    const ticket = await this.deps.tickets.mint(target);
    const socket = net.connect({ host: m[1]!, port: Number(m[2]), allowHalfOpen: true });
    // Small writes (a request's head, then its body) go out at once: no 40 ms Nagle waits.
    socket.setNoDelay(true);
    socket.write(`${ticket}\n`);
    const stream = new RelayStream(socket);
    const connectTimer = setTimeout(() => socket.destroy(new Error(`no connection within ${RELAY_CONNECT_TIMEOUT_MS} ms`)), RELAY_CONNECT_TIMEOUT_MS);
    socket.once('connect', () => clearTimeout(connectTimer));
    socket.once('close', () => clearTimeout(connectTimer));
    const answered = readLine(socket, RELAY_ANSWER_TIMEOUT_MS, MAX_RELAY_ANSWER_BYTES).then(
      (answer) => {
        if (answer !== 'ok') throw refusalOf(answer);
        stream.startReading();
      },
      (err: Error) => {
        throw new RollboxError('unavailable', `worker host ${nodeId}'s port relay at ${address}: ${err.message}`, 1);
      },
    );
    answered.catch((err: Error) => stream.destroy(err));
    return { stream, answered };
  }

  /**
   * One HTTP request: resolves once the server's answer has begun to be written to
   * `outgoing` (its body streams on); rejects with a coded error, nothing written, when the
   * port cannot be reached or the server never answers.
   */
  async http(nodeId: string, target: PortTarget, forwarding: Forwarding, incoming: http.IncomingMessage, outgoing: http.ServerResponse): Promise<void> {
    const { stream, answered } = await this.connect(nodeId, target);
    const request = http.request({ method: incoming.method, path: forwarding.path, headers: forwardedHeaders(incoming, forwarding, false), createConnection: () => stream as net.Socket });
    const response = await new Promise<http.IncomingMessage>((resolve, reject) => {
      // Settled once; errors are made only when they happen (a stack trace costs more than the rest of a request).
      let settled = false;
      const settle = (answer: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        answer();
      };
      const timer = setTimeout(() => settle(() => reject(new RollboxError('timeout', `the server on port ${target.port} of sandbox ${target.sandboxId} did not answer within ${RESPONSE_HEAD_TIMEOUT_MS / 1000} s`))), RESPONSE_HEAD_TIMEOUT_MS);
      answered.catch((err: Error) => settle(() => reject(err)));
      request.once('response', (r) => settle(() => resolve(r)));
      request.once('error', (err) => settle(() => reject(new RollboxError('port_closed', `the server on port ${target.port} of sandbox ${target.sandboxId} closed the connection without an answer: ${err.message}`))));
      outgoing.once('close', () => settle(() => reject(new Error('the client went away'))));
      incoming.pipe(request);
    }).catch((err: unknown) => {
      stream.destroy();
      throw err;
    });
    // The answer from here on: what the server sends, as it sends it.
    outgoing.writeHead(response.statusCode ?? 502, response.statusMessage, withoutHopByHop(response.rawHeaders, false));
    // The head goes out with the first bytes of the body when they are at hand (one write, one
    // packet), else on its own at once (a stream that starts later still shows its status).
    const flush = setImmediate(() => outgoing.flushHeaders());
    response.once('data', () => clearImmediate(flush));
    response.once('end', () => clearImmediate(flush));
    response.pipe(outgoing);
    response.once('error', () => outgoing.destroy());
    request.once('error', () => outgoing.destroy());
    outgoing.once('close', () => stream.destroy());
  }

  /**
   * An upgrade (a WebSocket's handshake): the request goes to the server as it came, and from
   * then on bytes pass both ways untouched (the server's own answer, 101 or a refusal,
   * included). Rejects with a coded error, nothing written, when the port cannot be reached.
   */
  async upgrade(nodeId: string, target: PortTarget, forwarding: Forwarding, incoming: http.IncomingMessage, client: Duplex, head: Buffer): Promise<void> {
    const { stream: socket, answered } = await this.connect(nodeId, target);
    const lines = [`${incoming.method} ${forwarding.path} HTTP/1.1`];
    const headers = forwardedHeaders(incoming, forwarding, true);
    for (let i = 0; i < headers.length; i += 2) lines.push(`${headers[i]}: ${headers[i + 1]}`);
    socket.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (head.length) socket.write(head);
    await answered;
    socket.on('error', () => client.destroy());
    client.on('error', () => socket.destroy());
    socket.once('close', () => client.destroy());
    client.once('close', () => socket.destroy());
    socket.pipe(client);
    client.pipe(socket);
  }
}

/**
 * A relay connection as the one stream the HTTP client (or an upgrade) uses: what is written
 * goes out at once, behind the ticket; what the port sends is read from `startReading` on
 * (after the relay's `ok`, which is not the port's). Lighter than composing the socket with a
 * PassThrough: one stream less per chunk, and no error made when it is destroyed.
 */
class RelayStream extends Duplex {
  private reading = false;

  constructor(private readonly socket: net.Socket) {
    super({ allowHalfOpen: true });
    socket.on('error', (err) => this.destroy(err));
    socket.once('close', () => this.destroy());
  }

  startReading(): void {
    this.reading = true;
    this.socket.on('data', (chunk: Buffer) => {
      if (!this.push(chunk)) this.socket.pause();
    });
    this.socket.once('end', () => this.push(null));
    this.socket.resume();
  }

  override _read(): void {
    if (this.reading) this.socket.resume();
  }

  override _write(chunk: Buffer, encoding: BufferEncoding, callback: (err?: Error | null) => void): void {
    this.socket.write(chunk, encoding, callback);
  }

  override _final(callback: (err?: Error | null) => void): void {
    this.socket.end(callback);
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    this.socket.destroy();
    callback(err);
  }
}

function refusalOf(answer: string): RollboxError {
  try {
    const { code, message } = JSON.parse(answer.replace(/^err /, '')) as { code: string; message: string };
    return new RollboxError(isErrorCode(code) ? code : 'internal', message);
  } catch {
    return new RollboxError('internal', `unexpected answer from a port relay: ${answer.slice(0, 200)}`);
  }
}

/** Raw headers (`[name, value, name, value...]`) less those of one hop (and, but for an upgrade, its own). */
function withoutHopByHop(raw: readonly string[], upgrade: boolean): string[] {
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    if (HOP_BY_HOP.has(name) && !(upgrade && (name === 'upgrade' || name === 'connection'))) continue;
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

function forwardedHeaders(incoming: http.IncomingMessage, forwarding: Forwarding, upgrade: boolean): string[] {
  const kept = withoutHopByHop(incoming.rawHeaders, upgrade);
  const out: string[] = [];
  for (let i = 0; i < kept.length; i += 2) {
    const name = kept[i]!.toLowerCase();
    if (name === 'host' || name.startsWith('x-forwarded-') || forwarding.drop.has(name)) continue;
    out.push(kept[i]!, kept[i + 1]!);
  }
  const forwardedHost = incoming.headers.host;
  out.push('Host', forwarding.host, 'X-Forwarded-Proto', 'http');
  if (forwardedHost) out.push('X-Forwarded-Host', forwardedHost);
  if (incoming.socket.remoteAddress) out.push('X-Forwarded-For', incoming.socket.remoteAddress);
  return out;
}

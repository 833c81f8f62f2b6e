import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { answerOf, type Answer } from './model-script.ts';

export type { ScriptTurn } from './model-script.ts';
import type { ScriptTurn } from './model-script.ts';

/** One request the upstream received. */
export interface Received {
  path: string;
  headers: http.IncomingHttpHeaders;
  body: Record<string, any>;
  turn: number;
  atMs: number;
}

export interface ScriptedUpstreamOptions {
  script: ScriptTurn[];
  model?: string;
  /** Characters per streamed piece of text or tool arguments. */
  chunkChars?: number;
}

/**
 * A model upstream for tests: a real HTTP server on loopback that replays a recorded
 * script of assistant turns (text, tool calls, or an error), in the shape of the route
 * called: OpenAI chat completions, completions and responses, Anthropic messages, each
 * streaming or not; vLLM's token fields (`return_token_ids`, `logprobs`) when asked. The
 * turn answered is the number of assistant turns in the request's conversation, so a
 * re-issued request gets the same answer (ROCK-style cursor: past the script, 404). It
 * can be stopped (connections refused), restarted on the same port, delayed, made to
 * fail or to cut its streams short, and it counts what it received.
 */
export class ScriptedUpstream {
  readonly received: Received[] = [];
  /** Before answering (headers), ms. */
  delayMs = 0;
  /** Between streamed events, ms. */
  chunkDelayMs = 0;
  /** The next answers end abruptly (socket destroyed), each after the events the next number says (a non-streaming body: after half its bytes). */
  cuts: number[] = [];
  /** Called with each request before it is answered (a test looks at the world as the request arrives). */
  onRequest: ((received: Received) => Promise<void>) | undefined;
  /** The next `count` answers are this status (an unavailable upstream: 503). */
  fail: { status: number; count: number } | undefined;
  private server: http.Server | undefined;
  private readonly sockets = new Set<Socket>();
  private port = 0;
  private requests = 0;

  private constructor(private readonly options: ScriptedUpstreamOptions) {}

  static async start(options: ScriptedUpstreamOptions): Promise<ScriptedUpstream> {
    const upstream = new ScriptedUpstream(options);
    await upstream.listen();
    return upstream;
  }

  /** The base URL to register (as an OpenAI client takes it). */
  get url(): string {
    return `http://127.0.0.1:${this.port}/v1`;
  }

  /** Requests received on a path (`/v1/chat/completions`, ...). */
  count(path: string): number {
    return this.received.filter((r) => r.path === path).length;
  }

  /** Stops listening and drops every open connection: new connections are refused. */
  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** Listens again on the same port. */
  restart(): Promise<void> {
    return this.listen();
  }

  private listen(): Promise<void> {
    // A request its client reset mid-body (a gateway that died, an agent killed) ends here, not the process.
    const server = http.createServer((req, res) => void this.handle(req, res).catch(() => res.destroy()));
    server.on('connection', (socket) => {
      this.sockets.add(socket);
      socket.once('close', () => this.sockets.delete(socket));
    });
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => {
        this.port = (server.address() as AddressInfo).port;
        resolve();
      });
    });
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    const body = text ? (JSON.parse(text) as Received['body']) : {};
    const path = (req.url ?? '').split('?')[0]!;
    const answer = answerOf(path, body, { script: this.options.script, model: this.options.model ?? 'scripted-model', chunkChars: this.options.chunkChars ?? 4, request: ++this.requests, headers: req.headers });
    const received: Received = { path, headers: req.headers, body, turn: answer.turn, atMs: Date.now() };
    this.received.push(received);
    await this.onRequest?.(received);
    if (this.delayMs) await sleep(this.delayMs);
    if (this.fail && this.fail.count > 0) {
      this.fail.count--;
      res.writeHead(this.fail.status, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: 'scripted failure', type: 'server_error' } }));
      return;
    }
    await this.send(res, answer, this.cuts.shift());
  }

  private async send(res: http.ServerResponse, answer: Answer, cutAfter: number | undefined): Promise<void> {
    if (answer.kind === 'json') {
      const text = JSON.stringify(answer.body);
      res.writeHead(answer.status, { 'content-type': 'application/json' });
      if (cutAfter === undefined) return void res.end(text);
      res.write(text.slice(0, text.length >> 1));
      await sleep(20);
      res.destroy();
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    res.flushHeaders();
    for (const [i, event] of answer.events.entries()) {
      if (cutAfter !== undefined && i >= cutAfter) {
        await sleep(20);
        res.destroy();
        return;
      }
      if (this.chunkDelayMs) await sleep(this.chunkDelayMs);
      if (res.destroyed) return;
      res.write(`${event.event ? `event: ${event.event}\n` : ''}data: ${typeof event.data === 'string' ? event.data : JSON.stringify(event.data)}\n\n`);
    }
    res.end();
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

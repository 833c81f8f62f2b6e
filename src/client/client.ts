import { randomUUID } from 'node:crypto';
import type { z } from 'zod';
import { serverSentEvents } from './body.ts';
import { RollboxApiError, apiErrorOf, isRetryable, networkMessage } from './errors.ts';
import {
  CommandInputResult,
  CommandList,
  CommandStatus,
  ExecResult,
  FilesWriteResult,
  JobActionResult,
  Layer,
  LayerList,
  Sandbox,
  SandboxList,
  SandboxMetrics,
  type CreateSandboxRequest,
  type ExecRequest,
  type ListSandboxesQuery,
  type PauseMode,
  type PolicyPatch,
  type PtyRequest,
  type PtySize,
  type SignalName,
  type SnapshotRequest,
} from '../api/index.ts';

/** One event of a streaming exec: output chunks in order, then the outcome (output not repeated). */
export type ExecStreamEvent =
  /** `pty`: a terminal's output (carriage returns and all). */
  | { type: 'stdout' | 'stderr' | 'pty'; data: string }
  | { type: 'exit'; result: Omit<ExecResult, 'stdout' | 'stderr'> & Partial<Pick<ExecResult, 'stdout' | 'stderr'>> };

export interface RetryPolicy {
  /** Tries in all, the first included. */
  attempts: number;
  baseDelayMs: number;
  maxDelayMs: number;
}

export interface RollboxClientOptions {
  baseUrl: string;
  token: string;
  retry?: Partial<RetryPolicy>;
  fetch?: typeof fetch;
  /** Called before each retry (for logs and metrics): which try failed, why, and the wait before the next. */
  onRetry?: (retry: { attempt: number; error: RollboxApiError; delayMs: number }) => void;
}

/**
 * Typed client for the rollbox HTTP API. Every retry reuses the same Idempotency-Key
 * (creates) and commandId (execs), so a retry after a dropped connection or a gateway
 * restart never creates a second sandbox or runs a command twice: it gets the first
 * result back (`replayed: true`).
 */
export class RollboxClient {
  private readonly retry: RetryPolicy;
  private readonly fetch: typeof fetch;

  constructor(private readonly options: RollboxClientOptions) {
    this.retry = { attempts: 8, baseDelayMs: 100, maxDelayMs: 5000, ...options.retry };
    this.fetch = options.fetch ?? fetch;
  }

  async createSandbox(request: z.input<typeof CreateSandboxRequest> = {}, options: { idempotencyKey?: string } = {}): Promise<Sandbox> {
    const idempotencyKey = options.idempotencyKey ?? `cli-${randomUUID()}`;
    return Sandbox.parse(await this.call('POST', '/v1/sandboxes', request, { 'idempotency-key': idempotencyKey }));
  }

  async getSandbox(id: string): Promise<Sandbox> {
    return Sandbox.parse(await this.call('GET', `/v1/sandboxes/${encodeURIComponent(id)}`));
  }

  async listSandboxes(query: Partial<Pick<ListSandboxesQuery, 'job' | 'label' | 'state' | 'limit'>> = {}): Promise<Sandbox[]> {
    const params = new URLSearchParams(Object.entries(query).flatMap(([k, v]) => (v === undefined ? [] : [[k, String(v)]])));
    return SandboxList.parse(await this.call('GET', `/v1/sandboxes?${params}`)).sandboxes;
  }

  async deleteSandbox(id: string): Promise<Sandbox> {
    return Sandbox.parse(await this.call('DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`));
  }

  /** A new task stage: the given network policy and/or hidden paths replace the current ones (a retry is harmless). */
  async setPolicy(id: string, patch: z.input<typeof PolicyPatch>): Promise<Sandbox> {
    return Sandbox.parse(await this.call('PATCH', `/v1/sandboxes/${encodeURIComponent(id)}/policy`, patch));
  }

  /** The sandbox ends `ttlSeconds` from now (sooner or later than it would have). */
  async setTtl(id: string, ttlSeconds: number): Promise<Sandbox> {
    return Sandbox.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/ttl`, { ttlSeconds }));
  }

  /** One sample of the sandbox's CPU, memory and disk use, read from its cgroups by its host (CPU: since the previous sample). */
  async metrics(id: string): Promise<SandboxMetrics> {
    return SandboxMetrics.parse(await this.call('GET', `/v1/sandboxes/${encodeURIComponent(id)}/metrics`));
  }

  /** Runs a command; give `commandId` to make re-sending it (e.g. after a preemption) safe. */
  async exec(id: string, request: z.input<typeof ExecRequest>): Promise<ExecResult> {
    const withId: ExecRequest | z.input<typeof ExecRequest> = { ...request, commandId: request.commandId ?? `c-${randomUUID()}` };
    return ExecResult.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/exec`, withId));
  }

  /**
   * A streaming exec (server-sent events). A dropped stream, or a gateway restart, is
   * resumed with the same commandId and the last event id seen: the command runs once
   * and no chunk is delivered twice or lost.
   */
  async *streamExec(id: string, request: Omit<z.input<typeof ExecRequest>, 'background'>): AsyncGenerator<ExecStreamEvent> {
    const body = JSON.stringify({ ...request, commandId: request.commandId ?? randomUUID() });
    yield* this.events(`/v1/sandboxes/${encodeURIComponent(id)}/exec`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  }

  /**
   * A command's output as it comes (a background or pty command, say), from its start,
   * then its outcome; a dropped stream is resumed where it stopped.
   */
  async *followCommand(id: string, commandId: string): AsyncGenerator<ExecStreamEvent> {
    yield* this.events(`/v1/sandboxes/${encodeURIComponent(id)}/commands/${encodeURIComponent(commandId)}`, { method: 'GET' });
  }

  /**
   * Starts a command on a terminal in the sandbox (default: the image's shell; 80x24),
   * answered at once with its status: follow it with followCommand, type with writeStdin,
   * resize with resizePty, end it with signalCommand.
   */
  async createPty(id: string, request: z.input<typeof PtyRequest> = {}): Promise<CommandStatus> {
    const withId = { ...request, commandId: request.commandId ?? `pty-${randomUUID()}` };
    return CommandStatus.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/pty`, withId));
  }

  /** A running pty command's new size (its foreground process group gets SIGWINCH). */
  async resizePty(id: string, commandId: string, size: PtySize): Promise<CommandInputResult> {
    return CommandInputResult.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/commands/${encodeURIComponent(commandId)}/resize`, size));
  }

  /** Server-sent command events from `path`, resumed after a drop from the last event id seen. */
  private async *events(path: string, init: { method: string; headers?: Record<string, string>; body?: string }): AsyncGenerator<ExecStreamEvent> {
    let lastEventId = '0';
    for (let attempt = 1; ; attempt++) {
      let error: RollboxApiError;
      try {
        const response = await this.fetch(this.url(path), { ...init, headers: { ...this.authHeader(), ...init.headers, accept: 'text/event-stream', 'last-event-id': lastEventId } });
        if (!response.ok || !response.body) throw await apiErrorOf(response);
        for await (const event of serverSentEvents(response.body)) {
          if (event.id) lastEventId = event.id;
          if (event.event === 'exit') {
            yield { type: 'exit', result: JSON.parse(event.data) };
            return;
          }
          if (event.event === 'stdout' || event.event === 'stderr') yield { type: event.event, data: event.data };
          if (event.event === 'pty') yield { type: 'pty', data: JSON.parse(event.data) as string };
          attempt = 0; // progress: a later drop starts its retries afresh
        }
        error = new RollboxApiError(0, 'network', 'the event stream ended before the exit event');
      } catch (err) {
        error = err instanceof RollboxApiError ? err : new RollboxApiError(0, 'network', networkMessage(err));
      }
      if (!isRetryable(error) || attempt >= this.retry.attempts) throw error;
      await this.backoff(attempt, error);
    }
  }

  /** mode freeze (cgroup freezer, memory kept), swap (frozen, memory paged out, processes kept) or hibernate (writable layer packed, memory freed). */
  async pause(id: string, mode: PauseMode = 'freeze'): Promise<Sandbox> {
    return Sandbox.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/pause`, { mode }));
  }

  async resume(id: string): Promise<Sandbox> {
    return Sandbox.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/resume`));
  }

  /** Every live sandbox labelled with the training job, on every worker host; each one's outcome. */
  async pauseJob(job: string, mode: PauseMode = 'freeze'): Promise<JobActionResult> {
    return JobActionResult.parse(await this.call('POST', `/v1/jobs/${encodeURIComponent(job)}/pause`, { mode }));
  }

  async resumeJob(job: string): Promise<JobActionResult> {
    return JobActionResult.parse(await this.call('POST', `/v1/jobs/${encodeURIComponent(job)}/resume`));
  }

  /** pack_diff: the writable layer as a new layer (needs the builder scope sandbox:snapshot). */
  async snapshot(id: string, request: z.input<typeof SnapshotRequest> = {}): Promise<Layer> {
    return Layer.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/snapshot`, request));
  }

  /** Starts a command in the background; poll `commandStatus` for its state and output. */
  async execBackground(id: string, request: Omit<z.input<typeof ExecRequest>, 'background'>): Promise<CommandStatus> {
    const withId = { ...request, background: true, commandId: request.commandId ?? `c-${randomUUID()}` };
    return CommandStatus.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/exec`, withId));
  }

  async commandStatus(id: string, commandId: string): Promise<CommandStatus> {
    return CommandStatus.parse(await this.call('GET', `/v1/sandboxes/${encodeURIComponent(id)}/commands/${encodeURIComponent(commandId)}`));
  }

  /** A signal (TERM, KILL, INT, ...) to a running command's process group, by its id. */
  async signalCommand(id: string, commandId: string, signal: SignalName): Promise<CommandInputResult> {
    return CommandInputResult.parse(await this.call('POST', `/v1/sandboxes/${encodeURIComponent(id)}/commands/${encodeURIComponent(commandId)}/signal`, { signal }));
  }

  /** Stdin for a running command started with `stdinOpen: true`; `eof` closes it. */
  async writeStdin(id: string, commandId: string, data: string, options: { eof?: boolean } = {}): Promise<CommandInputResult> {
    // Not retried once it may have arrived: the same bytes twice would be a different stdin.
    const init = { headers: { 'content-type': 'application/json' }, body: JSON.stringify({ data, eof: options.eof ?? false }), retry: 'refused' as const };
    return CommandInputResult.parse(await this.request('POST', `/v1/sandboxes/${encodeURIComponent(id)}/commands/${encodeURIComponent(commandId)}/stdin`, init, async (r) => JSON.parse(await r.text())));
  }

  /** The first `limit` commands of the log (see commandPage and allCommands for the rest). */
  async commands(id: string, limit = 1000) {
    return (await this.commandPage(id, { limit })).commands;
  }

  /** One page of the command log: `after` a `nextCursor` of the page before (default: from the first). */
  async commandPage(id: string, page: { after?: string; limit?: number } = {}): Promise<CommandList> {
    const query = new URLSearchParams({ limit: String(page.limit ?? 1000), ...(page.after === undefined ? {} : { after: page.after }) });
    return CommandList.parse(await this.call('GET', `/v1/sandboxes/${encodeURIComponent(id)}/commands?${query}`));
  }

  /** The whole command log (trajectory), oldest first, fetched a page at a time. */
  async *allCommands(id: string, options: { pageSize?: number } = {}): AsyncGenerator<CommandList['commands'][number]> {
    for (let after: string | undefined, first = true; first || after !== undefined; first = false) {
      const page = await this.commandPage(id, { limit: options.pageSize ?? 1000, ...(after === undefined ? {} : { after }) });
      yield* page.commands;
      after = page.nextCursor;
    }
  }

  /** A regular file of the sandbox, as bytes (paths resolve inside the sandbox). */
  async readFile(id: string, path: string): Promise<Uint8Array> {
    return (await this.call('GET', filesPath(id, { path }), undefined, { accept: 'application/octet-stream' }, { bytes: true })) as Uint8Array;
  }

  /** A directory of the sandbox (or one file) as a tar. */
  async getTar(id: string, path: string): Promise<Uint8Array> {
    return (await this.call('GET', filesPath(id, { path, format: 'tar' }), undefined, {}, { bytes: true })) as Uint8Array;
  }

  /** Writes a file (parents created). Idempotent, so it is retried like every call. */
  async writeFile(id: string, path: string, bytes: Uint8Array, options: { mode?: string } = {}): Promise<FilesWriteResult> {
    return FilesWriteResult.parse(await this.call('PUT', filesPath(id, { path, mode: options.mode }), bytes, { 'content-type': 'application/octet-stream' }));
  }

  /** Extracts a tar into the directory at path (created if missing). */
  async putTar(id: string, path: string, tar: Uint8Array): Promise<FilesWriteResult> {
    return FilesWriteResult.parse(await this.call('PUT', filesPath(id, { path }), tar, { 'content-type': 'application/x-tar' }));
  }

  async uploadLayer(tar: Uint8Array, name?: string): Promise<Layer> {
    return Layer.parse(await this.call('POST', `/v1/layers${name ? `?name=${encodeURIComponent(name)}` : ''}`, tar));
  }

  async listLayers(): Promise<Layer[]> {
    return LayerList.parse(await this.call('GET', '/v1/layers')).layers;
  }

  private async call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}, options: { bytes?: boolean } = {}): Promise<unknown> {
    const isTar = body instanceof Uint8Array;
    const init = {
      headers: { ...(isTar ? { 'content-type': 'application/x-tar' } : body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
      body: isTar ? (body as unknown as BodyInit) : body !== undefined ? JSON.stringify(body) : undefined,
    };
    return this.request(method, path, init, async (response) => {
      if (options.bytes) return new Uint8Array(await response.arrayBuffer());
      const text = await response.text();
      return text ? JSON.parse(text) : undefined;
    });
  }

  /**
   * One API request with the client's retries (the transport of every method here and of
   * BatchesClient); `read` takes a 2xx answer apart inside the try, so a connection dropped
   * mid-body is retried too. `retry`: `always` (the default: idempotent requests, or ones
   * carrying an idempotency key / commandId), `refused` (only answers saying the request was
   * not taken, 429 and 503: a create with no idempotency key), `never` (a body sent once).
   */
  async request<T>(
    method: string,
    path: string,
    init: { headers?: Record<string, string>; body?: BodyInit; retry?: 'always' | 'refused' | 'never' },
    read: (response: Response) => Promise<T>,
  ): Promise<T> {
    const retry = init.retry ?? 'always';
    // A streamed body needs half-duplex fetch, and `redirect: 'error'`: to follow redirects
    // fetch tees the body and the unread branch would buffer all of it (nodejs/undici#4058).
    const stream = init.body instanceof ReadableStream ? ({ duplex: 'half', redirect: 'error' } as const) : {};
    const requestInit: RequestInit = { method, headers: { ...this.authHeader(), ...init.headers }, body: init.body, ...stream };
    for (let attempt = 1; ; attempt++) {
      let error: RollboxApiError;
      try {
        const response = await this.fetch(this.url(path), requestInit);
        if (!response.ok) throw await apiErrorOf(response);
        return await read(response);
      } catch (err) {
        // A dropped connection or a gateway that is restarting: the request may or may not
        // have arrived; the idempotency key / commandId makes the retry safe either way.
        error = err instanceof RollboxApiError ? err : new RollboxApiError(0, 'network', networkMessage(err));
      }
      const again = retry === 'always' ? isRetryable(error) : retry === 'refused' && (error.status === 429 || error.status === 503) && isRetryable(error);
      if (!again || attempt >= this.retry.attempts) throw error;
      await this.backoff(attempt, error);
    }
  }

  private url(path: string): string {
    return `${this.options.baseUrl.replace(/\/$/, '')}${path}`;
  }

  private authHeader(): Record<string, string> {
    return { authorization: `Bearer ${this.options.token}` };
  }

  /**
   * Exponential backoff with jitter, never shorter than the server's Retry-After: the wait
   * before retry `attempt` (1-based) of this client's requests, and of a stream its callers
   * resume themselves (RolloutsClient.streamRollouts).
   */
  async backoff(attempt: number, error: RollboxApiError): Promise<void> {
    const backoffMs = Math.min(this.retry.maxDelayMs, this.retry.baseDelayMs * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2);
    const delayMs = Math.max(backoffMs, (error.retryAfterSeconds ?? 0) * 1000);
    this.options.onRetry?.({ attempt, error, delayMs });
    await new Promise((r) => setTimeout(r, delayMs));
  }
}

function filesPath(id: string, query: Record<string, string | undefined>): string {
  const params = new URLSearchParams(Object.entries(query).flatMap(([k, v]) => (v === undefined ? [] : [[k, v]])));
  return `/v1/sandboxes/${encodeURIComponent(id)}/files?${params}`;
}

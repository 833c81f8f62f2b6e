import type { ModelApi, ModelTokenFields, ModelTokens } from '../../api/index.ts';
import type { Overlap } from '../overlap.ts';
import type { SseEvent } from '../sse.ts';

/** What the agent itself asked for, so the fields injected for the trainer are taken out of its answer. */
export interface Asked {
  tokenIds: boolean;
  logprobs: boolean;
  /** The stream's usage chunk (`stream_options.include_usage`). */
  usage: boolean;
}

export type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

/** An event of a stream, with its data parsed when it is JSON (`[DONE]` is not). */
export interface StreamEvent extends SseEvent {
  json?: Json;
}

/** Token ids and logprobs gathered from one attempt's raw answer (before anything is taken out). */
export class TokenAcc {
  promptTokenIds: number[] | null = null;
  /** Usage as the upstream counted it (an injected usage chunk the agent does not see included). */
  usage: { promptTokens: number; completionTokens: number } | null = null;
  readonly choices = new Map<number, { tokenIds: number[] | null; logprobs: number[] | null }>();

  choice(index: number) {
    let c = this.choices.get(index);
    if (!c) this.choices.set(index, (c = { tokenIds: null, logprobs: null }));
    return c;
  }

  addIds(index: number, ids: unknown): void {
    if (!Array.isArray(ids)) return;
    const c = this.choice(index);
    (c.tokenIds ??= []).push(...(ids as number[]));
  }

  addLogprobs(index: number, values: number[]): void {
    if (values.length === 0) return;
    const c = this.choice(index);
    (c.logprobs ??= []).push(...values);
  }

  result(): ModelTokens | null {
    if (this.promptTokenIds === null && this.choices.size === 0) return null;
    return { promptTokenIds: this.promptTokenIds, choices: [...this.choices].sort((a, b) => a[0] - b[0]).map(([index, c]) => ({ index, ...c })) };
  }
}

/** Builds the record's `response` (a non-streaming body) from a stream's events, as the agent got them. */
export interface Assembler {
  event(event: StreamEvent): void;
  result(): { response: Json | null; finishReason: string | null; usage: { promptTokens: number; completionTokens: number } | null };
}

/** How the gateway speaks one model API: what it adds on the way up, takes out on the way down, and how a stream ends. */
export interface Dialect {
  readonly api: ModelApi;
  /** Error bodies and keepalives: OpenAI's or Anthropic's. */
  readonly flavor: 'openai' | 'anthropic';
  /** Appended to an upstream's base URL (which ends in `/v1`). */
  readonly path: string;
  /** The body sent upstream (token fields injected) and what the agent asked for itself. */
  prepare(body: Json, fields: ModelTokenFields): { upstream: Json; asked: Asked };
  /** Takes the injected fields out of a body or stream event (in place); false: drop the event. */
  strip(json: Json, asked: Asked, stream: boolean): boolean;
  /** Token ids and logprobs of a body or stream event. */
  collectTokens(json: Json, acc: TokenAcc): void;
  assembler(): Assembler;
  /** A non-streaming body's finish reason and usage. */
  summary(body: Json): ReturnType<Assembler['result']>;
  /** The stream's last event: held back until the call's record is durable. */
  isTerminal(event: StreamEvent): boolean;
  /** The upstream gave up on the generation (vLLM `finish_reason: abort`): a cut, not an answer. */
  isAbort(json: Json): boolean;
  /** Whether a stream that ended without its terminal event still holds a whole answer. */
  completeWithoutTerminal(assembled: ReturnType<Assembler['result']>): boolean;
  /**
   * Continuity across a re-issue: in `deliver` mode the overlap learns what the agent
   * received; in `continue` mode the event is trimmed to what the agent lacks (null: drop it).
   */
  reconcile(event: StreamEvent, overlap: Overlap): StreamEvent | null;
  /** An error as an event of this API's stream, which its SDKs raise. */
  errorEvent(status: number, code: string, message: string, sequence: number): SseEvent;
}

/** OpenAI's error `type` by status, as its SDKs and docs name them. */
export function openAiErrorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

/** Anthropic's error `type` by status (its API's documented list). */
export function anthropicErrorType(status: number): string {
  if (status === 401) return 'authentication_error';
  if (status === 403) return 'permission_error';
  if (status === 404) return 'not_found_error';
  if (status === 413) return 'request_too_large';
  if (status === 429) return 'rate_limit_error';
  if (status === 504) return 'timeout_error';
  if (status === 529) return 'overloaded_error';
  if (status >= 500) return 'api_error';
  return 'invalid_request_error';
}

/** A gateway error as an API's error body: OpenAI `{error: {message, type, param, code}}`, Anthropic `{type: "error", error: {type, message}}`. */
export function errorBody(flavor: Dialect['flavor'], status: number, code: string, message: string): Json {
  if (flavor === 'anthropic') return { type: 'error', error: { type: anthropicErrorType(status), message, code } };
  return { error: { message, type: openAiErrorType(status), param: null, code } };
}

/** The code and message of an error body of either shape (an upstream's, or ours). */
export function errorOf(body: string): { code: string; message: string } {
  try {
    const json = JSON.parse(body) as Json;
    const error = (json?.error ?? json) as Json;
    const message = typeof error?.message === 'string' ? error.message : body;
    const code = typeof error?.code === 'string' ? error.code : typeof error?.type === 'string' ? error.type : 'upstream_error';
    return { code, message };
  } catch {
    return { code: 'upstream_error', message: body.slice(0, 2000) };
  }
}

/** Parses an event's data when it is JSON. */
export function parsed(event: SseEvent): StreamEvent {
  if (!event.data.startsWith('{')) return event;
  try {
    return { ...event, json: JSON.parse(event.data) as Json };
  } catch {
    return event;
  }
}

/** The event as text again, from its JSON when it has one. */
export function serialized(event: StreamEvent): SseEvent {
  return event.json ? { ...(event.event ? { event: event.event } : {}), data: JSON.stringify(event.json) } : { ...(event.event ? { event: event.event } : {}), data: event.data };
}

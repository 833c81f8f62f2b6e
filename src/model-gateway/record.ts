import type { ModelAttempt, ModelCallRecord } from '../api/index.ts';
import type { Assembler, Json, TokenAcc } from './dialects/index.ts';
import type { CallSpec } from './call-spec.ts';

export const iso = (ms: number) => new Date(ms).toISOString();

/** How a call ended, as its clients get it: a status and body, or a stream's last event. */
export interface Answer {
  status: number;
  /** A body (an answer that does not stream, or an error before a stream began). */
  body?: string;
  /** `body` parsed, when it was read as JSON. */
  json?: Json;
  /** A stream's terminal event, held back until the record is durable. */
  terminal?: string;
  outcome: ModelCallRecord['outcome'];
  error?: { code: string; message: string };
}

/** The record of a call (its `seq` and `retriesJoined` are set as it is written). */
export function recordOf(
  spec: CallSpec,
  s: { answer: Answer; streamed: boolean; assembler: Assembler; tokens: TokenAcc; request: Json | null; upstream: string | null; attempts: ModelAttempt[]; heldMs: number; upstreamMs: number; endedAtMs: number },
): Omit<ModelCallRecord, 'seq' | 'retriesJoined'> {
  const { answer } = s;
  const body = answer.json ?? parseJson(answer.body);
  const summary = s.streamed ? s.assembler.result() : answer.outcome === 'ok' && body ? spec.dialect.summary(body) : { response: body ?? null, finishReason: null, usage: null };
  return {
    id: spec.callId,
    rolloutId: spec.rolloutId,
    job: spec.job,
    turn: spec.turn,
    api: spec.dialect.api,
    stream: spec.stream,
    request: s.request ?? spec.body,
    response: summary.response,
    status: answer.status,
    outcome: answer.outcome,
    ...(answer.error ? { error: answer.error } : {}),
    finishReason: summary.finishReason,
    tokens: s.tokens.result(),
    usage: s.tokens.usage ?? summary.usage,
    upstream: s.upstream,
    attempts: s.attempts,
    heldMs: s.heldMs,
    upstreamMs: s.upstreamMs,
    receivedAt: iso(spec.receivedAtMs),
    endedAt: iso(s.endedAtMs),
  };
}

function parseJson(text: string | undefined): Json | undefined {
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text) as Json;
  } catch {
    return undefined;
  }
}

import { errorBody, type Assembler, type Dialect, type Json } from './dialect.ts';

const TERMINAL = new Set(['response.completed', 'response.failed', 'response.incomplete', 'error']);
/** Events that carry a piece of text (or of a tool call's input) in `delta`. */
const isDelta = (type: string) => type.endsWith('.delta');
const LOGPROBS_INCLUDE = 'message.output_text.logprobs';

/** Sets every non-empty `logprobs` list to [] (the agent did not ask for them). */
function dropLogprobs(value: unknown): void {
  if (!value || typeof value !== 'object') return;
  if (Array.isArray(value)) return value.forEach(dropLogprobs);
  const record = value as Json;
  for (const [key, v] of Object.entries(record)) {
    if (key === 'logprobs' && Array.isArray(v)) record[key] = [];
    else dropLogprobs(v);
  }
}

function usageOf(response: Json | undefined | null) {
  const u = response?.usage as Json | undefined;
  return u ? { promptTokens: Number(u.input_tokens) || 0, completionTokens: Number(u.output_tokens) || 0 } : null;
}

function finishOf(response: Json | undefined | null): string | null {
  if (!response) return null;
  if (response.status === 'incomplete') return (response.incomplete_details?.reason as string | undefined) ?? 'incomplete';
  return (response.status as string | undefined) ?? null;
}

/**
 * OpenAI's `/v1/responses`: a stream of typed events (`event: response.output_text.delta`,
 * each with a `sequence_number`), ending with `response.completed` (or `.failed`,
 * `.incomplete`); no `[DONE]`. Logprobs come with `include: ["message.output_text.logprobs"]`.
 */
export const responses: Dialect = {
  api: 'responses',
  flavor: 'openai',
  path: '/responses',

  prepare(body, fields) {
    const include = Array.isArray(body.include) ? (body.include as string[]) : [];
    const asked = { tokenIds: true, logprobs: include.includes(LOGPROBS_INCLUDE), usage: true };
    const upstream: Json = { ...body };
    if (fields.logprobs && !asked.logprobs) {
      upstream.include = [...include, LOGPROBS_INCLUDE];
      if (fields.topLogprobs > 0 && body.top_logprobs === undefined) upstream.top_logprobs = fields.topLogprobs;
    }
    return { upstream, asked };
  },

  strip(json, asked) {
    if (!asked.logprobs) dropLogprobs(json);
    return true;
  },

  collectTokens(json, acc) {
    if (json.type === 'response.output_text.delta' && Array.isArray(json.logprobs)) acc.addLogprobs(Number(json.output_index) || 0, (json.logprobs as Json[]).map((l) => Number(l.logprob)));
    if (json.object === 'response') {
      (json.output as Json[] | undefined)?.forEach((item, index) => {
        for (const part of (item.content ?? []) as Json[]) if (Array.isArray(part.logprobs)) acc.addLogprobs(index, (part.logprobs as Json[]).map((l) => Number(l.logprob)));
      });
    }
  },

  assembler(): Assembler {
    let response: Json | null = null;
    return {
      event(event) {
        const r = event.json?.response as Json | undefined;
        if (r && typeof r === 'object') response = r;
      },
      result: () => ({ response, finishReason: finishOf(response), usage: usageOf(response) }),
    };
  },

  summary: (body) => ({ response: body, finishReason: finishOf(body), usage: usageOf(body) }),
  isTerminal: (event) => TERMINAL.has((event.json?.type as string | undefined) ?? event.event ?? ''),
  isAbort: () => false,
  completeWithoutTerminal: () => false,

  reconcile(event, overlap) {
    const json = event.json;
    if (!json) return event;
    const type = String(json.type ?? event.event ?? '');
    if (overlap.mode === 'deliver') overlap.sequence = Math.max(overlap.sequence, (Number(json.sequence_number) || 0) + 1);
    const where = `o${json.output_index ?? ''}.p${json.content_index ?? json.summary_index ?? ''}`;
    if (isDelta(type) && typeof json.delta === 'string') {
      const fresh = overlap.text(`${type}.${where}`, json.delta as string);
      if (overlap.mode === 'continue') {
        if (fresh === '') return null;
        if (fresh !== json.delta && Array.isArray(json.logprobs)) json.logprobs = [];
        json.delta = fresh;
      }
    } else if (!TERMINAL.has(type)) {
      const part = json.response ?? json.item ?? json.part ?? {};
      if (overlap.mark(`${type}.${where}`, part)) return null;
    }
    if (overlap.mode === 'continue') json.sequence_number = overlap.sequence++;
    return { ...event, json: overlap.mapIds(json) };
  },

  errorEvent: (status, code, message, sequence) => {
    const body = errorBody('openai', status, code, message);
    return { event: 'error', data: JSON.stringify({ type: 'error', code, message, param: null, sequence_number: sequence, ...body }) };
  },
};

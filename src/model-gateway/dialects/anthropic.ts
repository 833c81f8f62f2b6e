import { errorBody, type Assembler, type Dialect, type Json } from './dialect.ts';

/** The text a content block delta carries, by its type. */
const DELTA_FIELD: Record<string, string> = { text_delta: 'text', input_json_delta: 'partial_json', thinking_delta: 'thinking', signature_delta: 'signature', citations_delta: '' };

function usageOf(u: Json | undefined | null) {
  return u ? { promptTokens: Number(u.input_tokens) || 0, completionTokens: Number(u.output_tokens) || 0 } : null;
}

/**
 * Anthropic's `/v1/messages`: `message_start`, then per content block
 * `content_block_start`, `content_block_delta`s and `content_block_stop`, then
 * `message_delta` (stop reason, usage) and `message_stop`; `ping` events may come at
 * any time. `/v1/messages/count_tokens` is relayed, not recorded.
 */
export const messages: Dialect = {
  api: 'messages',
  flavor: 'anthropic',
  path: '/messages',

  prepare: (body) => ({ upstream: { ...body }, asked: { tokenIds: true, logprobs: true, usage: true } }),
  strip: () => true,
  collectTokens: () => {},

  assembler(): Assembler {
    let message: Json | null = null;
    const blocks = new Map<number, Json>();
    const json = new Map<number, string>();
    let usage: Json | null = null;
    return {
      event(event) {
        const e = event.json;
        if (!e) return;
        if (e.type === 'message_start') {
          message = { ...(e.message as Json) };
          usage = { ...((message.usage as Json | undefined) ?? {}) };
        } else if (e.type === 'content_block_start') {
          blocks.set(Number(e.index), { ...(e.content_block as Json) });
        } else if (e.type === 'content_block_delta') {
          const block = blocks.get(Number(e.index));
          const d = e.delta as Json;
          if (!block || !d) return;
          if (d.type === 'input_json_delta') json.set(Number(e.index), (json.get(Number(e.index)) ?? '') + String(d.partial_json ?? ''));
          else {
            const field = DELTA_FIELD[String(d.type)];
            if (field) block[field] = String(block[field] ?? '') + String(d[field] ?? '');
          }
        } else if (e.type === 'message_delta' && message) {
          Object.assign(message, e.delta as Json);
          if (e.usage) usage = { ...usage, ...(e.usage as Json) };
        }
      },
      result() {
        if (!message) return { response: null, finishReason: null, usage: null };
        const content = [...blocks].sort((a, b) => a[0] - b[0]).map(([index, block]) => {
          const input = json.get(index);
          if (input === undefined) return block;
          try {
            return { ...block, input: input ? JSON.parse(input) : {} };
          } catch {
            return { ...block, input };
          }
        });
        const response = { ...message, content, usage };
        return { response, finishReason: (message.stop_reason as string | undefined) ?? null, usage: usageOf(usage) };
      },
    };
  },

  summary: (body) => ({ response: body, finishReason: (body.stop_reason as string | undefined) ?? null, usage: usageOf(body.usage as Json | undefined) }),
  isTerminal: (event) => event.event === 'message_stop' || event.event === 'error' || event.json?.type === 'message_stop',
  isAbort: () => false,
  completeWithoutTerminal: () => false,

  reconcile(event, overlap) {
    const e = event.json;
    if (!e) return event;
    const index = Number(e.index);
    if (e.type === 'message_start' && overlap.mark('message', e.message)) return null;
    if (e.type === 'content_block_start' && overlap.mark(`b${index}`, e.content_block)) return null;
    if (e.type === 'content_block_stop' && overlap.mark(`b${index}.stop`, {})) return null;
    if (e.type === 'message_delta' && overlap.mark('message_delta', {})) return null;
    if (e.type === 'content_block_delta') {
      const d = e.delta as Json;
      const field = DELTA_FIELD[String(d?.type)];
      if (field && typeof d[field] === 'string') {
        const fresh = overlap.text(`b${index}.${field}`, d[field] as string);
        if (overlap.mode === 'continue') {
          if (fresh === '') return null;
          d[field] = fresh;
        }
      }
    }
    return { ...event, json: overlap.mapIds(e) };
  },

  errorEvent: (status, code, message) => ({ event: 'error', data: JSON.stringify(errorBody('anthropic', status, code, message)) }),
};

import type { Overlap } from '../overlap.ts';
import { errorBody, type Asked, type Assembler, type Dialect, type Json, type TokenAcc } from './dialect.ts';

/**
 * OpenAI's `/v1/chat/completions` and `/v1/completions` (vLLM's too): streams of
 * `data: {chunk}` ending `data: [DONE]`. vLLM's token fields: `return_token_ids` adds
 * `prompt_token_ids` (chat: top level, the first chunk; completions: per choice) and each
 * choice's `token_ids` (per chunk when streaming).
 */
function makeDialect(api: 'chat.completions' | 'completions'): Dialect {
  const chat = api === 'chat.completions';
  const usageOf = (u: Json | undefined | null) => (u && typeof u === 'object' ? { promptTokens: Number(u.prompt_tokens) || 0, completionTokens: Number(u.completion_tokens) || 0 } : null);
  return {
    api,
    flavor: 'openai',
    path: chat ? '/chat/completions' : '/completions',

    prepare(body, fields) {
      const asked: Asked = {
        tokenIds: body.return_token_ids === true,
        logprobs: chat ? body.logprobs === true : body.logprobs !== undefined && body.logprobs !== null,
        usage: body.stream_options?.include_usage === true,
      };
      const upstream: Json = { ...body };
      if (fields.returnTokenIds) upstream.return_token_ids = true;
      if (fields.logprobs && !asked.logprobs) {
        if (chat) {
          upstream.logprobs = true;
          if (fields.topLogprobs > 0) upstream.top_logprobs = fields.topLogprobs;
        } else upstream.logprobs = fields.topLogprobs;
      }
      // Usage counts a rollout's tokens (its limit, the job's figures).
      if (body.stream === true) upstream.stream_options = { ...(body.stream_options as Json | undefined), include_usage: true };
      return { upstream, asked };
    },

    strip(json, asked, stream) {
      if (stream && !asked.usage) {
        if (Array.isArray(json.choices) && json.choices.length === 0 && json.usage) return false;
        delete json.usage;
      }
      if (!asked.tokenIds) delete json.prompt_token_ids;
      for (const choice of (json.choices ?? []) as Json[]) {
        if (!asked.tokenIds) {
          delete choice.token_ids;
          delete choice.prompt_token_ids;
        }
        if (!asked.logprobs && 'logprobs' in choice) choice.logprobs = null;
      }
      return true;
    },

    collectTokens(json, acc: TokenAcc) {
      if (json.usage && typeof json.usage === 'object') acc.usage = usageOf(json.usage as Json);
      if (Array.isArray(json.prompt_token_ids)) acc.promptTokenIds = json.prompt_token_ids as number[];
      for (const choice of (json.choices ?? []) as Json[]) {
        const index = Number(choice.index) || 0;
        if (index === 0 && Array.isArray(choice.prompt_token_ids)) acc.promptTokenIds = choice.prompt_token_ids as number[];
        acc.addIds(index, choice.token_ids);
        const lp = choice.logprobs as Json | null | undefined;
        const values = chat ? ((lp?.content as Json[] | undefined) ?? []).map((t) => Number(t.logprob)) : ((lp?.token_logprobs as (number | null)[] | undefined) ?? []).filter((v): v is number => typeof v === 'number');
        acc.addLogprobs(index, values);
      }
    },

    assembler(): Assembler {
      let head: Json = {};
      let usage: Json | null = null;
      const choices = new Map<number, { text: string; reasoning: string; role: string; finish: string | null; tools: Map<number, Json>; logprobs: Json[] | null }>();
      return {
        event(event) {
          const json = event.json;
          if (!json) return;
          if (!head.id) head = { id: json.id, created: json.created, model: json.model, ...(json.system_fingerprint ? { system_fingerprint: json.system_fingerprint } : {}) };
          if (json.usage) usage = json.usage as Json;
          for (const c of (json.choices ?? []) as Json[]) {
            const index = Number(c.index) || 0;
            let acc = choices.get(index);
            if (!acc) choices.set(index, (acc = { text: '', reasoning: '', role: 'assistant', finish: null, tools: new Map(), logprobs: null }));
            const delta = (chat ? c.delta : c) as Json | undefined;
            if (typeof delta?.role === 'string') acc.role = delta.role;
            if (typeof (chat ? delta?.content : c.text) === 'string') acc.text += chat ? delta!.content : c.text;
            const reasoning = delta?.reasoning_content ?? delta?.reasoning;
            if (chat && typeof reasoning === 'string') acc.reasoning += reasoning;
            for (const tc of (delta?.tool_calls ?? []) as Json[]) {
              const j = Number(tc.index) || 0;
              const tool = acc.tools.get(j) ?? { id: '', type: 'function', function: { name: '', arguments: '' } };
              if (tc.id) tool.id = tc.id;
              if (tc.type) tool.type = tc.type;
              if (tc.function?.name) tool.function.name += tc.function.name;
              if (typeof tc.function?.arguments === 'string') tool.function.arguments += tc.function.arguments;
              acc.tools.set(j, tool);
            }
            const lp = c.logprobs as Json | null | undefined;
            if (chat && Array.isArray(lp?.content)) (acc.logprobs ??= []).push(...(lp!.content as Json[]));
            if (c.finish_reason) acc.finish = c.finish_reason as string;
          }
        },
        result() {
          const list = [...choices].sort((a, b) => a[0] - b[0]).map(([index, c]) => {
            if (!chat) return { index, text: c.text, logprobs: null, finish_reason: c.finish };
            const tools = [...c.tools].sort((a, b) => a[0] - b[0]).map(([, t]) => t);
            const message: Json = { role: c.role, content: c.text || (tools.length ? null : ''), ...(c.reasoning ? { reasoning_content: c.reasoning } : {}), ...(tools.length ? { tool_calls: tools } : {}) };
            return { index, message, logprobs: c.logprobs ? { content: c.logprobs } : null, finish_reason: c.finish };
          });
          const response = { ...head, object: chat ? 'chat.completion' : 'text_completion', choices: list, ...(usage ? { usage } : {}) };
          return { response, finishReason: list[0]?.finish_reason ?? null, usage: usageOf(usage) };
        },
      };
    },

    summary(body) {
      return { response: body, finishReason: (body.choices?.[0]?.finish_reason as string | undefined) ?? null, usage: usageOf(body.usage as Json | undefined) };
    },

    isTerminal: (event) => event.data === '[DONE]',
    isAbort: (json) => Array.isArray(json.choices) && (json.choices as Json[]).some((c) => c.finish_reason === 'abort'),
    completeWithoutTerminal: (a) => a.finishReason !== null && a.finishReason !== 'abort',

    reconcile(event, overlap) {
      const json = event.json;
      if (!json) return event;
      overlap.mark('chunk', { id: json.id });
      const choices: Json[] = [];
      for (const c of (json.choices ?? []) as Json[]) {
        if (reconcileChoice(c, overlap, chat)) choices.push(c);
      }
      if (overlap.mode === 'continue') {
        if (choices.length === 0 && !json.usage && (json.choices as Json[] | undefined)?.length) return null;
        json.choices = choices;
      }
      return { ...event, json: overlap.mapIds(json) };
    },

    errorEvent: (status, code, message) => ({ data: JSON.stringify(errorBody('openai', status, code, message)) }),
  };
}

/** One choice of a chunk through the overlap; false: nothing left of it for the agent. */
function reconcileChoice(c: Json, overlap: Overlap, chat: boolean): boolean {
  const i = Number(c.index) || 0;
  let trimmed = false;
  const text = (holder: Json, field: string, key: string) => {
    if (typeof holder[field] !== 'string') return;
    const fresh = overlap.text(key, holder[field] as string);
    if (fresh !== holder[field]) trimmed = true;
    // A completion choice's `text` stays (clients concatenate it); a delta field emptied by the overlap goes.
    if (fresh === '' && holder[field] !== '' && overlap.mode === 'continue' && field !== 'text') delete holder[field];
    else holder[field] = fresh;
  };
  if (!chat) text(c, 'text', `c${i}.text`);
  const delta = (c.delta ?? {}) as Json;
  if (chat) {
    if (delta.role !== undefined && overlap.mark(`c${i}.role`, {})) delete delta.role;
    for (const field of ['content', 'reasoning_content', 'reasoning', 'refusal']) text(delta, field, `c${i}.${field}`);
    if (Array.isArray(delta.tool_calls)) {
      delta.tool_calls = (delta.tool_calls as Json[]).filter((tc) => {
        const j = Number(tc.index) || 0;
        if ((tc.id || tc.function?.name) && overlap.mark(`c${i}.t${j}`, { id: tc.id })) {
          delete tc.id;
          delete tc.type;
          if (tc.function) delete tc.function.name;
        }
        if (tc.function) text(tc.function as Json, 'arguments', `c${i}.t${j}.args`);
        return overlap.mode === 'deliver' || tc.id !== undefined || (tc.function && Object.keys(tc.function as Json).length > 0);
      });
      if ((delta.tool_calls as Json[]).length === 0 && overlap.mode === 'continue') delete delta.tool_calls;
    }
  }
  if (c.finish_reason && overlap.mark(`c${i}.finish`, {})) c.finish_reason = null;
  if (overlap.mode === 'deliver') return true;
  if (trimmed) {
    // Logprobs and token ids of a partly hidden chunk no longer match its text (the record keeps the attempt's own).
    if ('logprobs' in c) c.logprobs = null;
    delete c.token_ids;
  }
  const hasText = chat ? Object.values(delta).some((v) => v !== '') : c.text !== '';
  return hasText || !!c.finish_reason || !!c.logprobs;
}

export const chatCompletions = makeDialect('chat.completions');
export const completions = makeDialect('completions');

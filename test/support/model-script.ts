import type http from 'node:http';
import type { ModelCallRecord } from '../../src/api/index.ts';

type Json = Record<string, any>;

/** One assistant turn of a script: text, tool calls, or an error answer. */
export interface ScriptTurn {
  text?: string;
  toolCalls?: { name: string; arguments: Record<string, unknown> }[];
  /** An error answer; `echoAuthorization` puts the request's credentials in its message (a careless upstream). */
  error?: { status: number; message: string; echoAuthorization?: boolean };
}

type Body = { kind: 'json'; status: number; body: Json } | { kind: 'sse'; events: { event?: string; data: Json | string }[] };
export type Answer = { turn: number } & Body;

interface Context {
  script: ScriptTurn[];
  model: string;
  chunkChars: number;
  /** This request's number (ids differ between requests, as a real upstream's do). */
  request: number;
  headers: http.IncomingHttpHeaders;
}

/** The turn a request asks for: how many assistant turns its conversation already holds. */
export function turnOf(path: string, body: Json): number {
  if (path.endsWith('/completions') && !path.endsWith('/chat/completions')) return (String(body.prompt ?? '').match(/<turn>/g) ?? []).length;
  if (path.endsWith('/responses')) {
    let turns = 0;
    let inTurn = false;
    for (const item of Array.isArray(body.input) ? (body.input as Json[]) : []) {
      const assistant = item.type === 'function_call' || item.role === 'assistant';
      if (assistant && !inTurn) turns++;
      inTurn = assistant;
    }
    return turns;
  }
  return ((body.messages ?? []) as Json[]).filter((m) => m.role === 'assistant').length;
}

/** Pieces of `text`, `size` characters each (at least one, maybe empty). */
const pieces = (text: string, size: number) => (text.length ? (text.match(new RegExp(`[\\s\\S]{1,${size}}`, 'g')) ?? []) : []);
/** Token ids of a piece of text, as the scripted model counts them: one per character, its code point. */
export const idsOf = (text: string) => [...text].map((c) => c.codePointAt(0)!);
const logprobOf = (i: number) => -((i % 5) + 1) / 10;

/** The scripted answer to one request. */
export function answerOf(path: string, body: Json, ctx: Context): Answer {
  const turn = turnOf(path, body);
  if (path.endsWith('/models')) return { turn, kind: 'json', status: 200, body: { object: 'list', data: [{ id: ctx.model, object: 'model', created: 0, owned_by: 'script' }] } };
  if (path.endsWith('/messages/count_tokens')) return { turn, kind: 'json', status: 200, body: { input_tokens: JSON.stringify(body.messages ?? []).length } };
  const anthropic = path.endsWith('/messages');
  const step = ctx.script[turn];
  if (!step) return { turn, kind: 'json', status: 404, body: errorShape(anthropic, 404, `the script has no turn ${turn}`) };
  if (step.error) {
    const message = step.error.echoAuthorization ? `${step.error.message} (you sent ${ctx.headers.authorization ?? ctx.headers['x-api-key']})` : step.error.message;
    return { turn, kind: 'json', status: step.error.status, body: errorShape(anthropic, step.error.status, message) };
  }
  const answer = anthropic ? messages(step, body, ctx) : path.endsWith('/responses') ? responses(step, body, ctx) : path.endsWith('/chat/completions') ? chat(step, body, ctx) : completions(step, body, ctx);
  return { turn, ...answer };
}

function errorShape(anthropic: boolean, status: number, message: string): Json {
  return anthropic ? { type: 'error', error: { type: status === 404 ? 'not_found_error' : 'invalid_request_error', message } } : { error: { message, type: 'invalid_request_error', param: null, code: null } };
}

const promptIds = (body: Json) => idsOf(JSON.stringify(body.messages ?? body.prompt ?? body.input ?? '').slice(0, 32));
const usageOf = (body: Json, step: ScriptTurn) => ({ prompt_tokens: JSON.stringify(body).length, completion_tokens: [...(step.text ?? '')].length + (step.toolCalls ?? []).reduce((n, t) => n + JSON.stringify(t.arguments).length, 0) });

function chatLogprobs(text: string, offset: number) {
  return { content: [...text].map((token, i) => ({ token, logprob: logprobOf(offset + i), bytes: [...Buffer.from(token)], top_logprobs: [] })) };
}

function chat(step: ScriptTurn, body: Json, ctx: Context): Body {
  const id = `chatcmpl-${ctx.request}`;
  const head = { id, object: 'chat.completion.chunk', created: 1_700_000_000, model: ctx.model };
  const ids = body.return_token_ids === true;
  const lp = body.logprobs === true;
  const usage = usageOf(body, step);
  const tools = (step.toolCalls ?? []).map((t, j) => ({ id: `call_${ctx.request}_${j}`, type: 'function', function: { name: t.name, arguments: JSON.stringify(t.arguments) } }));
  const finish = tools.length ? 'tool_calls' : 'stop';
  const text = step.text ?? '';
  const allText = text + tools.map((t) => t.function.arguments).join('');
  if (body.stream !== true) {
    const message = { role: 'assistant', content: text || null, ...(tools.length ? { tool_calls: tools } : {}) };
    const choice = { index: 0, message, logprobs: lp ? chatLogprobs(allText, 0) : null, finish_reason: finish, ...(ids ? { token_ids: idsOf(allText) } : {}) };
    return { kind: 'json', status: 200, body: { ...head, object: 'chat.completion', choices: [choice], usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens }, ...(ids ? { prompt_token_ids: promptIds(body) } : {}) } };
  }
  const withUsage = body.stream_options?.include_usage === true;
  let offset = 0;
  const chunk = (delta: Json, piece = '', finishReason: string | null = null) => {
    const c = { ...head, choices: [{ index: 0, delta, logprobs: lp && piece ? chatLogprobs(piece, offset) : null, finish_reason: finishReason, ...(ids ? { token_ids: idsOf(piece) } : {}) }], ...(withUsage ? { usage: null } : {}) };
    offset += [...piece].length;
    return { data: c };
  };
  const events: { data: Json | string }[] = [{ data: { ...chunk({ role: 'assistant', content: '' }).data, ...(ids ? { prompt_token_ids: promptIds(body) } : {}) } }];
  for (const piece of pieces(text, ctx.chunkChars)) events.push(chunk({ content: piece }, piece));
  tools.forEach((tool, j) => {
    events.push(chunk({ tool_calls: [{ index: j, id: tool.id, type: 'function', function: { name: tool.function.name, arguments: '' } }] }));
    for (const piece of pieces(tool.function.arguments, ctx.chunkChars)) events.push(chunk({ tool_calls: [{ index: j, function: { arguments: piece } }] }, piece));
  });
  events.push(chunk({}, '', finish));
  if (withUsage) events.push({ data: { ...head, choices: [], usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens } } });
  events.push({ data: '[DONE]' });
  return { kind: 'sse', events };
}

function completions(step: ScriptTurn, body: Json, ctx: Context): Body {
  const head = { id: `cmpl-${ctx.request}`, object: 'text_completion', created: 1_700_000_000, model: ctx.model };
  const ids = body.return_token_ids === true;
  const lp = body.logprobs !== undefined && body.logprobs !== null;
  const text = step.text ?? '';
  const usage = usageOf(body, step);
  const logprobs = (piece: string, offset: number) => ({ tokens: [...piece], token_logprobs: [...piece].map((_, i) => logprobOf(offset + i)), top_logprobs: [...piece].map(() => ({})), text_offset: [...piece].map((_, i) => offset + i) });
  if (body.stream !== true) {
    const choice = { index: 0, text, logprobs: lp ? logprobs(text, 0) : null, finish_reason: 'stop', ...(ids ? { token_ids: idsOf(text), prompt_token_ids: promptIds(body) } : {}) };
    return { kind: 'json', status: 200, body: { ...head, choices: [choice], usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens } } };
  }
  const withUsage = body.stream_options?.include_usage === true;
  const events: { data: Json | string }[] = [];
  let offset = 0;
  pieces(text, ctx.chunkChars).forEach((piece, i) => {
    events.push({ data: { ...head, choices: [{ index: 0, text: piece, logprobs: lp ? logprobs(piece, offset) : null, finish_reason: null, ...(ids ? { token_ids: idsOf(piece), ...(i === 0 ? { prompt_token_ids: promptIds(body) } : {}) } : {}) }], ...(withUsage ? { usage: null } : {}) } });
    offset += piece.length;
  });
  events.push({ data: { ...head, choices: [{ index: 0, text: '', logprobs: null, finish_reason: 'stop' }], ...(withUsage ? { usage: null } : {}) } });
  if (withUsage) events.push({ data: { ...head, choices: [], usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens } } });
  events.push({ data: '[DONE]' });
  return { kind: 'sse', events };
}

function responses(step: ScriptTurn, body: Json, ctx: Context): Body {
  const id = `resp_${ctx.request}`;
  const text = step.text ?? '';
  const u = usageOf(body, step);
  const usage = { input_tokens: u.prompt_tokens, output_tokens: u.completion_tokens, total_tokens: u.prompt_tokens + u.completion_tokens };
  const message = text ? [{ id: `msg_${ctx.request}`, type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text, annotations: [], logprobs: [] }] }] : [];
  const calls = (step.toolCalls ?? []).map((t, j) => ({ id: `fc_${ctx.request}_${j}`, type: 'function_call', status: 'completed', call_id: `call_${ctx.request}_${j}`, name: t.name, arguments: JSON.stringify(t.arguments) }));
  const output = [...message, ...calls];
  const response = (status: string, out: Json[]) => ({ id, object: 'response', created_at: 1_700_000_000, status, model: ctx.model, output: out, usage: status === 'completed' ? usage : null, error: null, incomplete_details: null });
  if (body.stream !== true) return { kind: 'json', status: 200, body: response('completed', output) };
  const events: { event: string; data: Json }[] = [];
  const add = (type: string, data: Json) => events.push({ event: type, data: { type, ...data, sequence_number: events.length } });
  add('response.created', { response: response('in_progress', []) });
  add('response.in_progress', { response: response('in_progress', []) });
  output.forEach((item, output_index) => {
    if (item.type === 'message') {
      add('response.output_item.added', { output_index, item: { ...item, status: 'in_progress', content: [] } });
      add('response.content_part.added', { item_id: item.id, output_index, content_index: 0, part: { type: 'output_text', text: '', annotations: [], logprobs: [] } });
      for (const delta of pieces(text, ctx.chunkChars)) add('response.output_text.delta', { item_id: item.id, output_index, content_index: 0, delta, logprobs: [] });
      add('response.output_text.done', { item_id: item.id, output_index, content_index: 0, text, logprobs: [] });
      add('response.content_part.done', { item_id: item.id, output_index, content_index: 0, part: (item as Json).content[0] });
    } else {
      add('response.output_item.added', { output_index, item: { ...item, status: 'in_progress', arguments: '' } });
      for (const delta of pieces((item as Json).arguments as string, ctx.chunkChars)) add('response.function_call_arguments.delta', { item_id: item.id, output_index, delta });
      add('response.function_call_arguments.done', { item_id: item.id, output_index, arguments: (item as Json).arguments });
    }
    add('response.output_item.done', { output_index, item });
  });
  add('response.completed', { response: response('completed', output) });
  return { kind: 'sse', events };
}

function messages(step: ScriptTurn, body: Json, ctx: Context): Body {
  const id = `msg_${ctx.request}`;
  const u = usageOf(body, step);
  const blocks: Json[] = [...(step.text ? [{ type: 'text', text: step.text }] : []), ...(step.toolCalls ?? []).map((t, j) => ({ type: 'tool_use', id: `toolu_${ctx.request}_${j}`, name: t.name, input: t.arguments }))];
  const stop = step.toolCalls?.length ? 'tool_use' : 'end_turn';
  const message = { id, type: 'message', role: 'assistant', model: ctx.model, content: blocks, stop_reason: stop, stop_sequence: null, usage: { input_tokens: u.prompt_tokens, output_tokens: u.completion_tokens } };
  if (body.stream !== true) return { kind: 'json', status: 200, body: message };
  const events: { event: string; data: Json }[] = [];
  const add = (type: string, data: Json = {}) => events.push({ event: type, data: { type, ...data } });
  add('message_start', { message: { ...message, content: [], stop_reason: null, usage: { input_tokens: u.prompt_tokens, output_tokens: 1 } } });
  add('ping');
  blocks.forEach((block, index) => {
    if (block.type === 'text') {
      add('content_block_start', { index, content_block: { type: 'text', text: '' } });
      for (const text of pieces(block.text as string, ctx.chunkChars)) add('content_block_delta', { index, delta: { type: 'text_delta', text } });
    } else {
      add('content_block_start', { index, content_block: { ...block, input: {} } });
      for (const partial_json of pieces(JSON.stringify(block.input), ctx.chunkChars)) add('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json } });
    }
    add('content_block_stop', { index });
  });
  add('message_delta', { delta: { stop_reason: stop, stop_sequence: null }, usage: { output_tokens: u.completion_tokens } });
  add('message_stop');
  return { kind: 'sse', events };
}

/** The text and tool calls of a recorded chat answer, to compare with the script. */
export function chatTurn(record: ModelCallRecord): ScriptTurn {
  const message = (record.response as { choices: { message: { content: string | null; tool_calls?: { function: { name: string; arguments: string } }[] } }[] }).choices[0]!.message;
  return { ...(message.content ? { text: message.content } : {}), ...(message.tool_calls ? { toolCalls: message.tool_calls.map((t) => ({ name: t.function.name, arguments: JSON.parse(t.function.arguments) })) } : {}) };
}

/** The text and tool calls of a recorded Anthropic message, to compare with the script. */
export function messagesTurn(record: ModelCallRecord): ScriptTurn {
  const blocks = (record.response as { content: ({ type: 'text'; text: string } | { type: 'tool_use'; name: string; input: Record<string, unknown> })[] }).content;
  const text = blocks.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join('');
  const toolCalls = blocks.flatMap((b) => (b.type === 'tool_use' ? [{ name: b.name, arguments: b.input }] : []));
  return { ...(text ? { text } : {}), ...(toolCalls.length ? { toolCalls } : {}) };
}

import { describe, expect, it } from 'vitest';
import { DIALECTS, type Json, type StreamEvent } from './dialects/index.ts';
import { Overlap } from './overlap.ts';

/** Runs a re-issue through the overlap: `delivered` is what the agent got, `again` the new attempt; returns what the agent gets next. */
function continueWith(api: keyof typeof DIALECTS, delivered: StreamEvent[], again: StreamEvent[]): { out: Json[]; overlap: Overlap } {
  const dialect = DIALECTS[api];
  const overlap = new Overlap();
  for (const event of delivered) dialect.reconcile(structuredClone(event), overlap);
  overlap.beginContinue();
  const out: Json[] = [];
  for (const event of again) {
    const kept = dialect.reconcile(structuredClone(event), overlap);
    if (kept?.json) out.push(kept.json);
  }
  return { out, overlap };
}

const chunk = (id: string, delta: Json, finish: string | null = null) => ({ data: '', json: { id, object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] } });

describe('re-issue continuity', () => {
  it('chat: hides what the agent has, keeps its ids, passes on the rest', () => {
    const delivered = [chunk('A', { role: 'assistant', content: '' }), chunk('A', { content: 'Let ' }), chunk('A', { content: 'me l' })];
    const again = [
      chunk('B', { role: 'assistant', content: '' }),
      chunk('B', { content: 'Let me' }),
      chunk('B', { content: ' look.' }),
      chunk('B', { tool_calls: [{ index: 0, id: 'call_B', type: 'function', function: { name: 'bash', arguments: '' } }] }),
      chunk('B', { tool_calls: [{ index: 0, function: { arguments: '{"cmd":"ls"}' } }] }),
      chunk('B', {}, 'tool_calls'),
    ];
    const { out, overlap } = continueWith('chat.completions', delivered, again);
    expect(overlap.diverged).toBe(false);
    expect(out.map((c) => c.id)).toEqual(['A', 'A', 'A', 'A']);
    expect(out.map((c) => c.choices[0].delta)).toEqual([{ content: 'ook.' }, { tool_calls: [{ index: 0, id: 'call_B', type: 'function', function: { name: 'bash', arguments: '' } }] }, { tool_calls: [{ index: 0, function: { arguments: '{"cmd":"ls"}' } }] }, {}]);
    expect(out.at(-1)!.choices[0].finish_reason).toBe('tool_calls');
    expect(overlap.deliveredChars()).toBe(8);
  });

  it('chat: a tool call the agent had half of is continued under its first id', () => {
    const delivered = [chunk('A', { role: 'assistant' }), chunk('A', { tool_calls: [{ index: 0, id: 'call_A', type: 'function', function: { name: 'bash', arguments: '{"cm' } }] })];
    const again = [chunk('B', { role: 'assistant' }), chunk('B', { tool_calls: [{ index: 0, id: 'call_B', type: 'function', function: { name: 'bash', arguments: '{"cmd":"ls"}' } }] }), chunk('B', {}, 'tool_calls')];
    const { out } = continueWith('chat.completions', delivered, again);
    expect(out.map((c) => c.choices[0].delta)).toEqual([{ tool_calls: [{ index: 0, function: { arguments: 'd":"ls"}' } }] }, {}]);
  });

  it('chat: a re-issue that says something else has diverged', () => {
    const { overlap } = continueWith('chat.completions', [chunk('A', { content: 'Hello' })], [chunk('B', { content: 'Help' })]);
    expect(overlap.diverged).toBe(true);
  });

  it('anthropic: drops the repeated start and blocks, maps the message id, continues the text', () => {
    const ev = (event: string, json: Json) => ({ event, data: '', json: { type: event, ...json } });
    const delivered = [ev('message_start', { message: { id: 'msg_A', content: [] } }), ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }), ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hi th' } })];
    const again = [
      ev('message_start', { message: { id: 'msg_B', content: [] } }),
      ev('ping', {}),
      ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hi there' } }),
      ev('content_block_stop', { index: 0 }),
      ev('content_block_start', { index: 1, content_block: { type: 'tool_use', id: 'toolu_B', name: 'bash', input: {} } }),
      ev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '{}' } }),
      ev('message_stop', {}),
    ];
    const { out } = continueWith('messages', delivered, again);
    expect(out.map((e) => e.type)).toEqual(['ping', 'content_block_delta', 'content_block_stop', 'content_block_start', 'content_block_delta', 'message_stop']);
    expect(out[1]!.delta.text).toBe('ere');
  });

  it('responses: numbers events on from the agent\'s last, and gives items the ids it knows', () => {
    const ev = (type: string, seq: number, json: Json) => ({ event: type, data: '', json: { type, sequence_number: seq, ...json } });
    const delivered = [
      ev('response.created', 0, { response: { id: 'resp_A', output: [] } }),
      ev('response.output_item.added', 1, { output_index: 0, item: { id: 'msg_A', type: 'message' } }),
      ev('response.output_text.delta', 2, { item_id: 'msg_A', output_index: 0, content_index: 0, delta: 'Hel' }),
    ];
    const again = [
      ev('response.created', 0, { response: { id: 'resp_B', output: [] } }),
      ev('response.output_item.added', 1, { output_index: 0, item: { id: 'msg_B', type: 'message' } }),
      ev('response.output_text.delta', 2, { item_id: 'msg_B', output_index: 0, content_index: 0, delta: 'Hello' }),
      ev('response.completed', 3, { response: { id: 'resp_B', output: [{ id: 'msg_B', type: 'message' }] } }),
    ];
    const { out } = continueWith('responses', delivered, again);
    expect(out.map((e) => [e.type, e.sequence_number])).toEqual([['response.output_text.delta', 3], ['response.completed', 4]]);
    expect(out[0]).toMatchObject({ item_id: 'msg_A', delta: 'lo' });
    expect(out[1]!.response).toEqual({ id: 'resp_A', output: [{ id: 'msg_A', type: 'message' }] });
  });
});

describe('token fields', () => {
  it('are injected for the trainer and taken out of what the agent did not ask for', () => {
    const chat = DIALECTS['chat.completions'];
    const { upstream, asked } = chat.prepare({ model: 'm', messages: [], stream: true }, { returnTokenIds: true, logprobs: true, topLogprobs: 2 });
    expect(upstream).toMatchObject({ return_token_ids: true, logprobs: true, top_logprobs: 2, stream_options: { include_usage: true } });
    const event = { id: 'A', prompt_token_ids: [1, 2], usage: null, choices: [{ index: 0, delta: { content: 'x' }, token_ids: [7], logprobs: { content: [{ token: 'x', logprob: -0.1 }] } }] };
    expect(chat.strip(event, asked, true)).toBe(true);
    expect(event).toEqual({ id: 'A', choices: [{ index: 0, delta: { content: 'x' }, logprobs: null }] });
    expect(chat.strip({ id: 'A', choices: [], usage: { prompt_tokens: 3 } }, asked, true)).toBe(false);
    const own = chat.prepare({ model: 'm', messages: [], return_token_ids: true, logprobs: true }, { returnTokenIds: true, logprobs: true, topLogprobs: 0 });
    const body = { prompt_token_ids: [1], choices: [{ index: 0, token_ids: [5], logprobs: { content: [] } }] };
    chat.strip(body, own.asked, false);
    expect(body).toEqual({ prompt_token_ids: [1], choices: [{ index: 0, token_ids: [5], logprobs: { content: [] } }] });
  });
});

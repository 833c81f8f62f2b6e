import { StringDecoder } from 'node:string_decoder';
import type { IncomingMessage } from 'node:http';
import { TokenAcc, parsed, serialized, type Asked, type Assembler, type Dialect, type Json, type StreamEvent } from './dialects/index.ts';
import type { Overlap } from './overlap.ts';
import { sseDecoder, sseText } from './sse.ts';
import { readAll } from './upstream.ts';

/** The largest body of an answer that does not stream. */
const MAX_BODY_BYTES = 64 * 1024 * 1024;

/** How one attempt's answer ended. */
export type AttemptEnd =
  | { kind: 'done'; body?: string; json?: Json; terminal?: string }
  | { kind: 'cut'; error: string }
  | { kind: 'diverged' };

export interface StreamSink {
  /** An event for the agent (already stripped). */
  deliver(text: string, event: StreamEvent): void;
}

/** Whether fields were injected that this agent did not ask for (then each body or event is stripped). */
export function needsStrip(asked: Asked, injected: Json, body: Json): boolean {
  return (!asked.tokenIds && injected.return_token_ids === true && body.return_token_ids !== true) || (!asked.logprobs && injected.logprobs !== body.logprobs) || (!asked.usage && injected.stream_options !== undefined) || injected.include !== body.include;
}

/**
 * A non-streaming answer: its body whole (cut: it ended early, is not JSON, or the
 * upstream aborted the generation), its token fields collected, then stripped.
 */
export async function readBody(body: IncomingMessage, dialect: Dialect, asked: Asked, strip: boolean, tokens: TokenAcc): Promise<AttemptEnd> {
  let text: string;
  try {
    text = await readAll(body, MAX_BODY_BYTES);
  } catch (err) {
    return { kind: 'cut', error: `answer cut short: ${(err as Error).message}` };
  }
  let json: Json;
  try {
    json = JSON.parse(text) as Json;
  } catch {
    return { kind: 'cut', error: 'answer cut short (not whole JSON)' };
  }
  if (dialect.isAbort(json)) return { kind: 'cut', error: 'the upstream aborted the generation (finish_reason abort)' };
  dialect.collectTokens(json, tokens);
  if (!strip) return { kind: 'done', body: text, json };
  dialect.strip(json, asked, false);
  return { kind: 'done', body: JSON.stringify(json), json };
}

/**
 * A streamed answer, event by event: token fields collected from the raw events, then
 * (after a re-issue) the part the agent already has hidden, the injected fields taken out,
 * and the event delivered; the terminal event is not delivered but returned, to go out
 * with the record. A stream that ends without it (and without a whole answer) is cut.
 */
export function readStream(body: IncomingMessage, o: { dialect: Dialect; asked: Asked; strip: boolean; tokens: TokenAcc; overlap: Overlap; assembler: Assembler; sink: StreamSink }): Promise<AttemptEnd> {
  const { dialect, overlap } = o;
  return new Promise<AttemptEnd>((resolve) => {
    let settled = false;
    let terminal: string | undefined;
    const settle = (end: AttemptEnd) => {
      if (settled) return;
      settled = true;
      if (end.kind !== 'done') body.destroy();
      resolve(end);
    };
    const onEvent = (raw: { event?: string; data: string }) => {
      if (settled || terminal !== undefined) return;
      let event: StreamEvent | null = parsed(raw);
      if (event.json) {
        dialect.collectTokens(event.json, o.tokens);
        if (dialect.isAbort(event.json)) return settle({ kind: 'cut', error: 'the upstream aborted the generation (finish_reason abort)' });
      }
      const isTerminal = dialect.isTerminal(event);
      let changed = false;
      if (overlap.mode === 'continue') {
        event = dialect.reconcile(event, overlap);
        if (overlap.diverged) return settle({ kind: 'diverged' });
        if (!event) return;
        changed = true;
      }
      if (o.strip && event.json) {
        if (!dialect.strip(event.json, o.asked, true)) return;
        changed = true;
      }
      const text = sseText(changed ? serialized(event) : raw);
      o.assembler.event(event);
      if (isTerminal) terminal = text;
      else o.sink.deliver(text, event);
    };
    const decode = sseDecoder(onEvent);
    const utf8 = new StringDecoder('utf8');
    body.on('data', (chunk: Buffer) => decode(utf8.write(chunk)));
    body.on('end', () => {
      decode(utf8.end());
      decode('\n\n');
      if (terminal !== undefined) settle({ kind: 'done', terminal });
      else if (dialect.completeWithoutTerminal(o.assembler.result())) settle({ kind: 'done' });
      else settle({ kind: 'cut', error: 'stream ended before its last event' });
    });
    body.on('error', (err) => settle({ kind: 'cut', error: `stream cut: ${err.message}` }));
    body.on('aborted', () => settle({ kind: 'cut', error: 'stream cut (connection closed)' }));
    body.on('close', () => setImmediate(() => settle({ kind: 'cut', error: 'stream cut (connection closed)' })));
  });
}

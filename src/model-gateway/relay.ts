import { errorBody, errorOf, type Dialect } from './dialects/index.ts';
import type { CallEntry } from './calls.ts';
import type { EntrySource } from './feed.ts';
import { KEEPALIVE, sseText } from './sse.ts';

export interface RelayOptions {
  dialect: Dialect;
  stream: boolean;
  /** When the call arrived (an early 200 goes out once it is `earlyHeadersMs` old). */
  receivedAtMs: number;
  keepaliveMs: number;
  earlyHeadersMs: number;
  /** Headers every answer carries (the call's id and turn). */
  headers: Record<string, string>;
  now: () => number;
}

const SSE_HEADERS = { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' };

/**
 * One client's answer, read from its call's entries. It answers as the upstream did
 * (status, body, or a stream relayed event by event) unless the call is held: then a
 * streaming call gets its 200 and SSE keepalives (Anthropic `ping` events) at once, and a
 * call that does not stream gets an early 200 once it is `earlyHeadersMs` old, then a
 * space every `keepaliveMs` until its body. An error after the 200 went out becomes the
 * stream's error event (or, without a stream, the body).
 */
export async function relay(source: EntrySource, o: RelayOptions): Promise<Response> {
  let held = false;
  let status = 200;
  let contentType = 'application/json';
  let body: string | undefined;
  for (;;) {
    const early = o.receivedAtMs + o.earlyHeadersMs - o.now();
    if (held && !o.stream && early <= 0) return open(source, o, { status: 200, sse: false, written: KEEPALIVE.json });
    const entry = await source.next(held && !o.stream ? Math.max(1, early) : o.keepaliveMs);
    if (entry === 'timeout') continue;
    if (entry === null) return gone(o);
    if (entry.t === 'held') {
      held = true;
      if (o.stream) return open(source, o, { status: 200, sse: true, written: keepalive(o) });
    } else if (entry.t === 'head') {
      status = entry.status;
      contentType = entry.contentType;
      if (o.stream && status < 300) return open(source, o, { status, sse: true, written: '' });
    } else if (entry.t === 'data') body = (body ?? '') + entry.d;
    else if (entry.t === 'end') {
      source.close();
      return new Response(body ?? '', { status, headers: { ...o.headers, 'content-type': contentType } });
    }
  }
}

function keepalive(o: RelayOptions): string {
  if (!o.stream) return KEEPALIVE.json;
  return o.dialect.flavor === 'anthropic' ? KEEPALIVE.anthropic : KEEPALIVE.sse;
}

/** The call's entries went away before its end (another gateway took it over): the client retries, and its retry joins the call there. */
function gone(o: RelayOptions): Response {
  const message = 'the call moved to another gateway before it answered; retry the request';
  return new Response(JSON.stringify(errorBody(o.dialect.flavor, 503, 'unavailable', message)), { status: 503, headers: { ...o.headers, 'content-type': 'application/json' } });
}

/** The 200 went out: the rest of the entries are written as they come, with keepalives while none do. */
function open(source: EntrySource, o: RelayOptions, start: { status: number; sse: boolean; written: string }): Response {
  const encoder = new TextEncoder();
  let cancelled = false;
  let status = start.status;
  let events = 0;
  const readable = new ReadableStream<Uint8Array>({
    start(controller) {
      const write = (text: string) => {
        if (!cancelled && text) controller.enqueue(encoder.encode(text));
      };
      write(start.written);
      const loop = async () => {
        let lastWriteMs = o.now();
        for (;;) {
          const first: CallEntry | 'timeout' | null = await source.next(Math.max(1, o.keepaliveMs - (o.now() - lastWriteMs)));
          if (cancelled) return;
          if (first === null) return controller.error(new Error('the call moved to another gateway before it ended'));
          if (first === 'timeout') {
            write(keepalive(o));
            lastWriteMs = o.now();
            continue;
          }
          // A burst (the events of one upstream read) goes out as one write.
          let text = '';
          let ended = false;
          for (let entry: CallEntry | undefined = first; entry && !ended; entry = source.poll()) {
            if (entry.t === 'head') status = entry.status;
            else if (entry.t === 'end') ended = true;
            else if (entry.t === 'data') {
              if (start.sse && status >= 300) {
                const error = errorOf(entry.d);
                text += sseText(o.dialect.errorEvent(status, error.code, error.message, events));
              } else text += entry.d;
              events++;
            }
          }
          write(text);
          if (text) lastWriteMs = o.now();
          if (ended) {
            source.close();
            return controller.close();
          }
        }
      };
      loop().catch((err: unknown) => {
        if (!cancelled) controller.error(err);
      });
    },
    cancel() {
      // The client left: the call goes on (its record too); only this reader stops.
      cancelled = true;
      source.close();
    },
  });
  return new Response(readable, { status: start.status, headers: { ...o.headers, ...(start.sse ? SSE_HEADERS : { 'content-type': 'application/json' }) } });
}

import { createParser } from 'eventsource-parser';

/** One server-sent event: its name (when it has one) and its data (lines joined by `\n`). */
export interface SseEvent {
  event?: string;
  data: string;
}

/** Feeds text in; calls `onEvent` for each whole event (comments, such as an upstream's keepalives, are dropped). */
export function sseDecoder(onEvent: (event: SseEvent) => void): (chunk: string) => void {
  const parser = createParser({ onEvent: (e) => onEvent(e.event ? { event: e.event, data: e.data } : { data: e.data }) });
  return (chunk) => parser.feed(chunk);
}

/** An event as it goes to the agent. */
export function sseText(event: SseEvent): string {
  const data = event.data.split('\n').map((line) => `data: ${line}\n`).join('');
  return `${event.event ? `event: ${event.event}\n` : ''}${data}\n`;
}

/**
 * Keepalives while a call is held or its upstream is silent. An SSE comment line with no
 * blank line after it (a blank line would end an empty event, which some clients
 * JSON-decode and fail on); Anthropic's own `ping` event, which its SDKs skip; a space
 * in a JSON body whose 200 went out early (JSON allows leading whitespace).
 */
export const KEEPALIVE = {
  sse: ': keepalive\n',
  anthropic: sseText({ event: 'ping', data: '{"type": "ping"}' }),
  json: ' ',
} as const;

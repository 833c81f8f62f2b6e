/** Response and request bodies the client modules share: server-sent events, JSON, streamed uploads. */

/** Server-sent events of a response body: `event`, `id` and (multi-line) `data` fields. */
export async function* serverSentEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<{ event: string; id?: string; data: string }> {
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const bytes of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(bytes, { stream: true }).replace(/\r\n/g, '\n');
    for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event: { event: string; id?: string; data: string } = { event: 'message', data: '' };
      const data: string[] = [];
      for (const line of block.split('\n')) {
        const colon = line.indexOf(':');
        if (colon === 0) continue; // a comment (keep-alive)
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') event.event = value;
        else if (field === 'id') event.id = value;
        else if (field === 'data') data.push(value);
      }
      event.data = data.join('\n');
      if (data.length || event.event !== 'message') yield event;
    }
  }
}

/** A response body parsed as JSON (answers are then checked against their schema). */
export async function json(response: Response): Promise<unknown> {
  return JSON.parse(await response.text());
}

/** A pull stream over chunks: the next is read only when fetch wants it, so a file is never held whole. */
export function streamOf(chunks: AsyncIterable<string | Uint8Array>): ReadableStream<Uint8Array> {
  const iterator = chunks[Symbol.asyncIterator]();
  const encoder = new TextEncoder();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { value, done } = await iterator.next();
      if (done) controller.close();
      else controller.enqueue(typeof value === 'string' ? encoder.encode(value) : value);
    },
    async cancel(reason) {
      await iterator.return?.(reason);
    },
  });
}

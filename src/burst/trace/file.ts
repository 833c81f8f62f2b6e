import fs from 'node:fs';
import { TRACE_FORMAT, TraceEvent, TraceHeader } from '../../api/index.ts';

/** One JSON line per object; the live recorder appends `traceLine(event)` as creates arrive. */
export function traceLine(value: TraceHeader | TraceEvent): string {
  return `${JSON.stringify(value)}\n`;
}

export function writeTraceFile(file: string, header: TraceHeader, events: readonly TraceEvent[]): void {
  const fd = fs.openSync(file, 'w');
  try {
    fs.writeSync(fd, traceLine(header));
    const chunk: string[] = [];
    for (const event of events) {
      chunk.push(traceLine(event));
      if (chunk.length === 10_000) fs.writeSync(fd, chunk.splice(0).join(''));
    }
    fs.writeSync(fd, chunk.join(''));
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Parses a trace (JSON lines: optional header, then events), naming the line of the
 * first bad entry. Events are sorted by arrival (stable), since a recorder with several
 * gateways may write them slightly out of order.
 */
export function parseTrace(text: string): { header: TraceHeader | undefined; events: TraceEvent[] } {
  const events: TraceEvent[] = [];
  let header: TraceHeader | undefined;
  let lineNumber = 0;
  for (const line of text.split('\n')) {
    lineNumber++;
    if (line.trim() === '') continue;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      throw new Error(`trace line ${lineNumber}: not JSON`);
    }
    if (lineNumber === 1 && typeof value === 'object' && value !== null && (value as { format?: unknown }).format === TRACE_FORMAT) {
      const parsed = TraceHeader.safeParse(value);
      if (!parsed.success) throw new Error(`trace line 1 (header): ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
      header = parsed.data;
      continue;
    }
    const parsed = TraceEvent.safeParse(value);
    if (!parsed.success) throw new Error(`trace line ${lineNumber}: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
    events.push(parsed.data);
  }
  let sorted = true;
  for (let i = 1; i < events.length && sorted; i++) sorted = events[i - 1]!.atMs <= events[i]!.atMs;
  if (!sorted) events.sort((a, b) => a.atMs - b.atMs);
  return { header, events };
}

export function readTraceFile(file: string): { header: TraceHeader | undefined; events: TraceEvent[] } {
  return parseTrace(fs.readFileSync(file, 'utf8'));
}

/** Keys whose string values are ids an answer hands out (its own, its items', its tool calls'). */
const ID_KEYS = new Set(['id', 'item_id', 'call_id']);

/**
 * What the agent already received of a streamed answer, so that a re-issued answer
 * continues it instead of starting it again: the re-issue runs from the start, and
 * whatever it repeats is hidden (policy "re-issue, hide the duplicate prefix", see
 * docs/model-gateway.md). Text is compared per key (a choice's content, a tool call's
 * arguments, a content block's text): the re-issue must repeat what was delivered, else
 * the stream has diverged (an upstream that samples differently) and cannot be mended.
 * Structural parts (a role, a tool call's start, a content block's start) are sent once;
 * the re-issue's ids are mapped to the ones the agent has.
 */
export class Overlap {
  mode: 'deliver' | 'continue' = 'deliver';
  diverged = false;
  /** Events delivered (the Responses API numbers them: a continuation goes on from here). */
  sequence = 0;
  private readonly delivered = new Map<string, string>();
  private readonly repeated = new Map<string, string>();
  private readonly marks = new Map<string, unknown>();
  private readonly ids = new Map<string, string>();

  /** Text at `key`: in deliver mode noted; in continue mode, the part the agent lacks ('' when it has it all). */
  text(key: string, text: string): string {
    if (this.mode === 'deliver') {
      this.delivered.set(key, (this.delivered.get(key) ?? '') + text);
      return text;
    }
    const before = this.repeated.get(key) ?? '';
    const now = before + text;
    this.repeated.set(key, now);
    const had = this.delivered.get(key) ?? '';
    if (now.length <= had.length) {
      if (!had.startsWith(now)) this.diverged = true;
      return '';
    }
    if (!now.startsWith(had)) {
      this.diverged = true;
      return '';
    }
    return now.slice(Math.max(had.length, before.length));
  }

  /** A structural part: true when the agent already has it (drop the re-issue's copy; its ids now stand for the delivered ones). */
  mark(key: string, part: unknown): boolean {
    if (this.mode === 'deliver') {
      this.marks.set(key, part);
      return false;
    }
    if (!this.marks.has(key)) return false;
    pairIds(part, this.marks.get(key), this.ids);
    return true;
  }

  /** The re-issue's ids replaced by the delivered ones, everywhere in `value` (in place). */
  mapIds<T>(value: T): T {
    if (this.ids.size > 0) replaceIds(value, this.ids);
    return value;
  }

  /** Characters of text the agent had when the re-issue began. */
  deliveredChars(): number {
    let n = 0;
    for (const text of this.delivered.values()) n += text.length;
    return n;
  }

  /** Whether anything at all was delivered (a re-issue with nothing to hide needs no continuity). */
  get empty(): boolean {
    return this.delivered.size === 0 && this.marks.size === 0;
  }

  /** Starts continuing: text the next attempt produces is compared from its start again. */
  beginContinue(): void {
    this.mode = 'continue';
    this.repeated.clear();
  }
}

function pairIds(fresh: unknown, had: unknown, ids: Map<string, string>): void {
  if (!fresh || !had || typeof fresh !== 'object' || typeof had !== 'object') return;
  if (Array.isArray(fresh)) {
    if (Array.isArray(had)) fresh.forEach((item, i) => pairIds(item, had[i], ids));
    return;
  }
  for (const [key, value] of Object.entries(fresh)) {
    const old = (had as Record<string, unknown>)[key];
    if (ID_KEYS.has(key) && typeof value === 'string' && typeof old === 'string' && value !== old) ids.set(value, old);
    else pairIds(value, old, ids);
  }
}

function replaceIds(value: unknown, ids: Map<string, string>): void {
  if (!value || typeof value !== 'object') return;
  if (Array.isArray(value)) {
    for (const item of value) replaceIds(item, ids);
    return;
  }
  const record = value as Record<string, unknown>;
  for (const [key, v] of Object.entries(record)) {
    if (ID_KEYS.has(key) && typeof v === 'string' && ids.has(v)) record[key] = ids.get(v);
    else replaceIds(v, ids);
  }
}

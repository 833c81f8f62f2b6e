import { describe, expect, it } from 'vitest';
import type { CommandRecord, ModelCallRecord } from '../api/index.ts';
import { interleave } from './index.ts';

const call = (turn: number, receivedAt: string): ModelCallRecord => ({
  id: `c${turn}`, rolloutId: 'r', job: 'j', turn, seq: turn, api: 'chat.completions', stream: false, request: {}, response: null, status: 200, outcome: 'ok',
  finishReason: 'stop', tokens: null, usage: null, upstream: null, attempts: [], heldMs: 0, upstreamMs: 0, retriesJoined: 0, receivedAt, endedAt: receivedAt,
});
const command = (commandId: string, queuedAt: string, startedAt?: string): CommandRecord => ({ commandId, argv: ['true'], state: 'done', node: 'n', queuedAt, startedAt });

describe('rollout trajectory', () => {
  it('interleaves model calls and commands by when they began, calls first on a tie', () => {
    const t = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s)).toISOString();
    const entries = interleave(
      [call(2, t(3)), call(1, t(0))],
      [{ sandboxId: 's', command: command('b', t(3), t(4)) }, { sandboxId: 's', command: command('a', t(1)) }, { sandboxId: 's', command: command('x', t(2), t(3)) }],
    );
    expect(entries.map((e) => (e.kind === 'model_call' ? `call${e.call.turn}` : e.command.commandId))).toEqual(['call1', 'a', 'call2', 'x', 'b']);
    expect(entries.map((e) => e.at)).toEqual([t(0), t(1), t(3), t(3), t(4)]);
  });
});

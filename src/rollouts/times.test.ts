import { describe, expect, it } from 'vitest';
import { ROLLOUT_TIME_PARTS } from '../api/index.ts';
import { rolloutEndOf } from './job-times.ts';
import { rolloutTimes } from './times.ts';

const T0 = Date.UTC(2026, 0, 1);
const at = (ms: number) => new Date(T0 + ms).toISOString();
const call = (fromMs: number, toMs: number, heldMs = 0) => ({ receivedAt: at(fromMs), endedAt: at(toMs), heldMs });
const command = (fromMs: number, toMs?: number) => ({ queuedAt: at(fromMs), ...(toMs === undefined ? {} : { endedAt: at(toMs) }) });
const sumOfParts = (t: Record<string, number>) => ROLLOUT_TIME_PARTS.reduce((s, p) => s + t[p]!, 0);

describe('rollout times', () => {
  it('splits a sequential rollout: creates, then model turns (held, then upstream) and commands, the rest the agent', () => {
    const times = rolloutTimes({
      window: { fromMs: T0, toMs: T0 + 10_000 },
      envWaits: [{ fromMs: T0, toMs: T0 + 800 }, { fromMs: T0 + 810, toMs: T0 + 1500 }],
      calls: [call(2000, 3000), call(4000, 7000, 2000)],
      commands: [command(1600, 1900), command(3100, 3500), command(7100, 7300)],
    });
    expect(times).toEqual({ envWait: 1490, modelUpstream: 1000 + 1000, modelHeld: 2000, tool: 300 + 400 + 200, agent: 10_000 - 1490 - 2000 - 2000 - 900, total: 10_000 });
    expect(sumOfParts(times)).toBe(times.total);
  });

  it('counts overlapping time once, model first, then tool; clips to the window; leaves commands still running out', () => {
    const times = rolloutTimes({
      window: { fromMs: T0 + 1000, toMs: T0 + 6000 },
      envWaits: [{ fromMs: T0, toMs: T0 + 1200 }],
      // Two calls at once (one held meanwhile), a command beside them, one running past the exit.
      calls: [call(2000, 4000), call(2500, 3500, 1500)],
      commands: [command(3000, 4500), command(5000), command(5500, 9000)],
    });
    // 2000-4000 upstream (the second call's held time under the first's upstream), 4000-4500 tool, 5500-6000 tool.
    expect(times).toEqual({ envWait: 200, modelUpstream: 2000, modelHeld: 0, tool: 1000, agent: 5000 - 200 - 2000 - 1000, total: 5000 });
    expect(sumOfParts(times)).toBe(times.total);
  });

  it('gives all of an empty rollout to the agent, and a held call its hold', () => {
    expect(rolloutTimes({ window: { fromMs: T0, toMs: T0 + 50 }, envWaits: [], calls: [], commands: [] })).toEqual({ modelUpstream: 0, modelHeld: 0, tool: 0, envWait: 0, agent: 50, total: 50 });
    const held = rolloutTimes({ window: { fromMs: T0, toMs: T0 + 5000 }, envWaits: [], calls: [call(0, 5000, 4200.4)], commands: [] });
    expect(held).toMatchObject({ modelHeld: 4200, modelUpstream: 800, agent: 0 });
  });
});

describe('how a rollout ended', () => {
  it('is its task status, except a failure after a model limit, which is the limit', () => {
    const rollout = { id: 'r', modelCalls: 1, tokens: 0 };
    expect(rolloutEndOf({ status: 'succeeded', rollout })).toBe('succeeded');
    expect(rolloutEndOf({ status: 'failed', rollout })).toBe('failed');
    expect(rolloutEndOf({ status: 'failed', rollout: { ...rollout, hit: 'max_model_calls' } })).toBe('limit');
    expect(rolloutEndOf({ status: 'timeout', rollout: { ...rollout, hit: 'wall_time' } })).toBe('limit');
    // An agent that got past a refused call and still succeeded succeeded.
    expect(rolloutEndOf({ status: 'succeeded', rollout: { ...rollout, hit: 'max_tokens' } })).toBe('succeeded');
    expect(rolloutEndOf({ status: 'cancelled' })).toBe('cancelled');
  });
});

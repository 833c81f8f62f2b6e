import { describe, expect, it } from 'vitest';
import { RolloutAgent } from '../api/index.ts';
import { agentEnv } from './agent-env.ts';

describe('rollout agent env', () => {
  it('points both SDKs at the rollout model route and carries only the rollout key', () => {
    const env = agentEnv({ gatewayUrlFromSandbox: 'http://10.0.0.1:8080/', rolloutId: 'r1', rolloutKey: 'rk_x', taskSandboxId: 'sb1' });
    expect(env.ROLLBOX_URL).toBe('http://10.0.0.1:8080');
    expect(env.OPENAI_BASE_URL).toBe('http://10.0.0.1:8080/v1/rollouts/r1/model/v1');
    expect(env.ANTHROPIC_BASE_URL).toBe('http://10.0.0.1:8080/v1/rollouts/r1/model');
    expect(new Set([env.ROLLBOX_API_KEY, env.OPENAI_API_KEY, env.ANTHROPIC_API_KEY])).toEqual(new Set(['rk_x']));
    expect(env.ROLLBOX_SANDBOX_ID).toBe('sb1');
  });
  it('an agent gives exactly one of argv and cmd, and a timeout', () => {
    expect(RolloutAgent.safeParse({ cmd: 'sh run.sh', timeoutMs: 1000 }).success).toBe(true);
    expect(RolloutAgent.safeParse({ cmd: 'x', argv: ['x'], timeoutMs: 1000 }).success).toBe(false);
    expect(RolloutAgent.safeParse({ cmd: 'x' }).success).toBe(false);
  });
});

import { SANDBOX_GATEWAY_URL, type BatchTask, type ExecResult, type NetworkPolicy, type RolloutOutcome } from '../../api/index.ts';
import type { Principal, RolloutKeyStore } from '../../iam/index.ts';
import type { RolloutRecords } from '../../registry/index.ts';
import { agentEnv, type RolloutService, type Span } from '../../rollouts/index.ts';
import type { ExecService } from '../exec-service.ts';

/** What running a hosted rollout's agent needs beyond a task's deps: its key and its model limits. */
export interface RolloutDeps {
  keys: Pick<RolloutKeyStore, 'issue' | 'grantSandbox' | 'revoke'>;
  records: Pick<RolloutRecords, 'put'>;
  limits: { set(rolloutId: string, limits: { maxModelCalls?: number; maxTokens?: number; deadlineMs?: number }): Promise<void>; usage(rolloutId: string): Promise<{ calls: number; tokens: number; hit?: RolloutOutcome['hit'] }> };
  /** Where an attempt's time went, computed when its agent exits. */
  times: Pick<RolloutService, 'finish'>;
}

type Agent = NonNullable<BatchTask['agent']>;

/** The id a rollout attempt's model calls are recorded under (and its trajectory read by). */
export const rolloutIdOf = (batchId: string, customId: string, attempt: number) => `${batchId}.${customId}.${attempt}`;
export const agentCommandIdOf = (batchId: string, attempt: number) => `${batchId}.${attempt}.agent`;

/** The agent sandbox's network: the gateway and nothing else. */
export const AGENT_NETWORK: NetworkPolicy = { mode: 'none', allow: [], gateway: true };

/**
 * Grants a rollout attempt its key (its task sandbox and its model calls only) and limits,
 * before its agent sandbox exists: the env the agent command gets.
 */
export async function prepareRollout(
  deps: RolloutDeps,
  input: { tenant: string; job: string; batchId: string; customId: string; attempt: number; taskSandboxId: string; agentSandboxId: string; agent: Agent; limits: BatchTask['limits']; ttlSeconds: number; now: number; envWaits: Span[] },
): Promise<{ rolloutId: string; env: Record<string, string> }> {
  const { tenant, job, batchId, customId, attempt, taskSandboxId, agentSandboxId, ttlSeconds, envWaits } = input;
  const rolloutId = rolloutIdOf(batchId, customId, attempt);
  await deps.records.put({ id: rolloutId, tenant, job, batchId, customId, attempt, taskSandboxId, agentSandboxId, createdAt: new Date(input.now).toISOString(), envWaits });
  const key = await deps.keys.issue({ tenant, rolloutId, job, ttlSeconds });
  await deps.keys.grantSandbox(rolloutId, taskSandboxId, ttlSeconds);
  await deps.limits.set(rolloutId, { ...input.limits, deadlineMs: input.now + input.agent.timeoutMs });
  return { rolloutId, env: { ...input.agent.env, ...agentEnv({ gatewayUrlFromSandbox: SANDBOX_GATEWAY_URL, rolloutId, rolloutKey: key, taskSandboxId }) } };
}

/**
 * Runs (or, re-sent with the same command id after its runner died, waits for) the agent's
 * command in its sandbox: it goes on through a gateway's or a worker host's death.
 */
export function runAgentCommand(execs: Pick<ExecService, 'exec'>, acting: Principal, agentSandboxId: string, agent: Agent, env: Record<string, string>, commandId: string): Promise<ExecResult> {
  return execs.exec(acting, agentSandboxId, { ...(agent.argv ? { argv: agent.argv } : { cmd: agent.cmd! }), env, timeoutMs: agent.timeoutMs, background: false, commandId });
}

/** What the attempt's model calls came to and where its time went (its agent exited at `endedAtMs`), for its result line. */
export async function rolloutOutcome(deps: RolloutDeps, rolloutId: string, endedAtMs: number): Promise<RolloutOutcome> {
  const [usage, timesMs] = await Promise.all([deps.limits.usage(rolloutId), deps.times.finish(rolloutId, endedAtMs)]);
  return { id: rolloutId, modelCalls: usage.calls, tokens: usage.tokens, ...(usage.hit ? { hit: usage.hit } : {}), ...(timesMs ? { timesMs } : {}) };
}

/** What an agent sandbox needs to reach the gateway as its rollout (issue 39 point 1). */
export interface AgentEnvInput {
  /** The gateway URL as a sandbox reaches it (not as the host does). */
  gatewayUrlFromSandbox: string;
  rolloutId: string;
  /** The rollout key: the only credential that enters the agent sandbox. */
  rolloutKey: string;
  taskSandboxId: string;
}

export function agentEnv(i: AgentEnvInput): Record<string, string> {
  const gateway = i.gatewayUrlFromSandbox.replace(/\/+$/, '');
  const model = `${gateway}/v1/rollouts/${encodeURIComponent(i.rolloutId)}/model`;
  return {
    ROLLBOX_URL: gateway,
    ROLLBOX_API_KEY: i.rolloutKey,
    ROLLBOX_SANDBOX_ID: i.taskSandboxId,
    ROLLBOX_ROLLOUT_ID: i.rolloutId,
    OPENAI_BASE_URL: `${model}/v1`,
    ANTHROPIC_BASE_URL: model,
    OPENAI_API_KEY: i.rolloutKey,
    ANTHROPIC_API_KEY: i.rolloutKey,
  };
}

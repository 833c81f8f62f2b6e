export { interleave } from './trajectory.ts';
export { agentEnv, type AgentEnvInput } from './agent-env.ts';

export { agentEnv, type AgentEnvInput } from './agent-env.ts';

export { interleave } from './trajectory.ts';
export { agentEnv, type AgentEnvInput } from './agent-env.ts';
export { RolloutService, type RolloutServiceDeps } from './service.ts';
export { rolloutTimes, type Span } from './times.ts';
export { JobRolloutTimesStore, rolloutEndOf } from './job-times.ts';

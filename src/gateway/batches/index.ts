export { BatchService, isTerminalBatch } from './service.ts';
export { BatchRunner, pickBatch } from './runner.ts';
export { runTask } from './task.ts';
export type { TaskDeps, TaskOutcome, TaskRun } from './task.ts';

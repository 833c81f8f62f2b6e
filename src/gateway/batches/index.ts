export { BatchService, isTerminalBatch, type BatchServiceDeps } from './service.ts';
export { BatchRunner, pickBatch } from './runner.ts';
export type { TaskEnded } from './runner.ts';
export { runTask } from './task.ts';
export type { TaskDeps, TaskOutcome, TaskRun } from './task.ts';
export { BatchJobs, customIdOfJob, taskJobId } from './jobs.ts';
export type { BatchJobsDeps, TaskJob } from './jobs.ts';

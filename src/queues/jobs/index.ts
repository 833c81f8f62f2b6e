export { JOB_KEY_PREFIX, connectJobRedis, jobQueueName } from './connection.ts';
export { JobWorkerWatchdog } from './watchdog.ts';
export type { WatchedWorker } from './watchdog.ts';
export { CreateJobConsumer, CreateJobQueues, createQueueName } from './create-jobs.ts';
export type { CreateJobData } from './create-jobs.ts';

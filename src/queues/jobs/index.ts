export { JOB_KEY_PREFIX, connectJobRedis, jobQueueName } from './connection.ts';
export { JobWorkerWatchdog } from './watchdog.ts';
export type { WatchedWorker } from './watchdog.ts';

export { RollboxClient, RollboxApiError } from './client.ts';
export { serverSentEvents } from './body.ts';
export type { ExecStreamEvent, RollboxClientOptions, RetryPolicy } from './client.ts';
export { BatchesClient, NDJSON_TYPE } from './batches.ts';
export type { BatchResultsOptions, BatchSubmitOptions } from './batches.ts';
export { ImagesClient } from './images.ts';
export type { ImportImageOptions } from './images.ts';
export { ForksClient } from './forks.ts';
export { SandboxFilesClient } from './files.ts';

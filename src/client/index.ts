export { RollboxClient, RollboxApiError } from './client.ts';
export type { ExecStreamEvent, RollboxClientOptions, RetryPolicy } from './client.ts';

export { RollboxClient, RollboxApiError } from './client.ts';
export type { RollboxClientOptions, RetryPolicy } from './client.ts';

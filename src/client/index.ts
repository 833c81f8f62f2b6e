export { RollboxClient, RollboxApiError, serverSentEvents } from './client.ts';
export type { ExecStreamEvent, RollboxClientOptions, RetryPolicy } from './client.ts';

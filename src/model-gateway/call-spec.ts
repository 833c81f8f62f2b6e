import type { Dialect, Json } from './dialects/index.ts';

/** What a call is: who made it, what it asks, where it stands. */
export interface CallSpec {
  tenant: string;
  job: string;
  rolloutId: string;
  callId: string;
  bodyHash: string;
  /** This run's owner token (the call's lease and its record are fenced by it). */
  owner: string;
  turn: number;
  receivedAtMs: number;
  dialect: Dialect;
  stream: boolean;
  /** The agent's body. */
  body: Json;
  /** The agent's headers that go upstream (API version, betas). */
  forward: Record<string, string>;
  /** This gateway took the call over from one that died running it: it is re-issued. */
  takeover?: boolean;
}

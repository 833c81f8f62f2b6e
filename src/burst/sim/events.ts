/** The simulator's events and the states of a create and a cloud host. */

export const END_LOCAL = 0;
export const END_CLOUD = 1;
export const TICK = 2;
export const CLOUD_READY = 3;
export const GIVE_UP = 4;
export const CLOUD_WAIT_OVER = 5;

export interface SimEvent {
  atMs: number;
  seq: number;
  kind: number;
  /** Create index, or cloud host index for CLOUD_READY. */
  id: number;
  /** Node or cloud host index. */
  where: number;
}

// Outcome of a create; 0 = not arrived yet.
export const WAITING = 1;
/** Diverted, waiting for a cloud slot only (model.cloudWaitMs), before falling back to local. */
export const WAITING_FOR_CLOUD = 5;
export const STARTED_LOCAL = 2;
export const STARTED_CLOUD = 3;
export const REFUSED = 4;

export interface CloudHost {
  id: string;
  /** Position in cloudHosts. */
  index: number;
  state: 'provisioning' | 'ready' | 'terminated';
  sandboxes: number;
  idleSinceMs: number | null;
  provisionedAtMs: number;
}

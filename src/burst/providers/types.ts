/**
 * How the burst controller starts and stops cloud hosts (VMs that run
 * `rollbox worker --pool cloud`). Chosen once at start; see README "Live cloud burst".
 */
export interface ProvisionRequest {
  /** The node id the new host must use (ROLLBOX_NODE_ID): heartbeats are matched by it. */
  hostId: string;
  pool: string;
  /** Where the host fetches layer blobs, and the token to do it with (layer read scope). */
  gatewayUrl: string;
  token: string;
  /** The Redis every gateway and worker host meets at. */
  redisUrl: string;
  /** Layer digests the host syncs before it reports ready. */
  layers: string[];
  /** Sandbox slots the host should offer (ROLLBOX_NODE_MAX_SANDBOXES). */
  slots: number;
}

export interface ProviderHost {
  /** The provider's id for the machine (given back by provision). */
  id: string;
  /** Free text from the provider (e.g. running, stopping); the controller only checks presence. */
  state: string;
  startedAtMs: number;
}

export interface CloudProvider {
  readonly name: string;
  provision(request: ProvisionRequest): Promise<{ id: string }>;
  /** Idempotent: terminating a machine that is already gone is not an error. */
  terminate(id: string): Promise<void>;
  list(): Promise<ProviderHost[]>;
  /** Releases what the provider holds locally (child processes of the local provider). */
  close?(): Promise<void>;
}

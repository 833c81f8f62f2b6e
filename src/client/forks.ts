import { randomUUID } from 'node:crypto';
import type { z } from 'zod';
import { ForkResult, type ForkRequest, type SnapshotForkRequest } from '../api/index.ts';
import { json } from './body.ts';
import type { RollboxClient } from './client.ts';

/**
 * Forks over a RollboxClient (scope sandbox:create). Each fork carries one
 * Idempotency-Key through the client's retries, so a retry answers the same children
 * instead of packing the parent again and making N more.
 */
export class ForksClient {
  constructor(private readonly client: RollboxClient) {}

  /**
   * N children (1-64) from a sandbox's current state (running, paused or hibernated), in
   * order, each running or refused with a coded error; the parent runs on. Only when no
   * child could be made does it throw (with the refusal's code).
   */
  async fork(sandboxId: string, request: ForkRequest, options: { idempotencyKey?: string } = {}): Promise<ForkResult> {
    return this.post(`/v1/sandboxes/${encodeURIComponent(sandboxId)}/fork`, request, options.idempotencyKey);
  }

  /** N children on a snapshot (the digest `snapshot()` answered), with the settings a create takes. */
  async forkSnapshot(digest: string, request: z.input<typeof SnapshotForkRequest>, options: { idempotencyKey?: string } = {}): Promise<ForkResult> {
    return this.post(`/v1/snapshots/${encodeURIComponent(digest)}/fork`, request, options.idempotencyKey);
  }

  private async post(path: string, body: unknown, idempotencyKey = `fork-${randomUUID()}`): Promise<ForkResult> {
    const init = { headers: { 'content-type': 'application/json', 'idempotency-key': idempotencyKey }, body: JSON.stringify(body) };
    return ForkResult.parse(await this.client.request('POST', path, init, json));
  }
}

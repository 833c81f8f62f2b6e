import { expect } from 'vitest';
import type { ImageRecord } from '../../src/api/index.ts';
import { api, waitFor, type TestCluster } from './cluster.ts';

type Body = ImageRecord & { error?: { code: string; message: string } };

/** POST /v1/images/pull: the 202 answer's record. */
export async function startPull(cluster: Pick<TestCluster, 'url'>, token: string, body: { ref: string; name?: string; platform?: string }): Promise<ImageRecord> {
  const r = await api<Body>(cluster, token, 'POST', '/v1/images/pull', body);
  expect(r.status, JSON.stringify(r.body)).toBe(202);
  return r.body;
}

/** The record once the pull `pullId` has ended (ready or failed). */
export async function pullEnded(cluster: Pick<TestCluster, 'url'>, token: string, name: string, pullId: string, timeoutMs = 60_000): Promise<ImageRecord> {
  return waitFor(
    `pull ${pullId} of ${name}`,
    async () => {
      const r = await api<ImageRecord>(cluster, token, 'GET', `/v1/images/${name}`);
      return r.status === 200 && r.body.pull?.id === pullId && r.body.pull.state !== 'pulling' ? r.body : undefined;
    },
    timeoutMs,
  );
}

/** Pull and wait: the ended record. */
export async function pulled(cluster: Pick<TestCluster, 'url'>, token: string, body: { ref: string; name?: string; platform?: string }): Promise<ImageRecord> {
  const started = await startPull(cluster, token, body);
  return pullEnded(cluster, token, started.name, started.pull!.id);
}

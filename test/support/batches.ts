import { expect } from 'vitest';
import type { Batch, BatchResultLine } from '../../src/api/index.ts';
import { api, type TestCluster } from './cluster.ts';

const ENDED = ['completed', 'cancelled', 'failed', 'expired'];

/** Every result line of a batch, following it (long-poll) until it ends, and the batch as it ended. */
export async function allBatchResults(cluster: Pick<TestCluster, 'url'>, token: string, id: string, waitSeconds = 5): Promise<{ lines: BatchResultLine[]; batch: Batch }> {
  const lines: BatchResultLine[] = [];
  let after = '';
  for (;;) {
    const r = await fetch(`${cluster.url}/v1/batches/${id}/results?waitSeconds=${waitSeconds}${after ? `&after=${after}` : ''}`, { headers: { authorization: `Bearer ${token}` } });
    expect(r.status).toBe(200);
    const text = await r.text();
    lines.push(...text.split('\n').filter(Boolean).map((l) => JSON.parse(l) as BatchResultLine));
    after = r.headers.get('x-rollbox-cursor') ?? after;
    if (ENDED.includes(r.headers.get('x-rollbox-batch-state')!) && text === '') return { lines, batch: (await api<Batch>(cluster, token, 'GET', `/v1/batches/${id}`)).body };
  }
}

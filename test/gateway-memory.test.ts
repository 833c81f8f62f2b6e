/**
 * The gateway's memory stays bounded whatever a layer's entry count or the pattern of
 * layer reads (issue 38): a gateway process of its own (so its RSS is only its own) takes a
 * layer of 1,000,000 empty files, then 64 gzipped 16 MiB range reads of a layer blob at
 * once by one sandbox-scope token. Its peak RSS (VmHWM, reset before each phase) is
 * measured against its RSS before; reads past the caps are refused coded and retryable, and
 * a host's lazy fetcher, given the same 64 reads, gets every one by retrying.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LayerChunkTable } from '../src/api/index.ts';
import { CHUNK_ENCODING_HEADER, parseChunkTable } from '../src/layers/index.ts';
import { fetchChunks } from '../src/layers/lazy/fetcher.ts';
import { startTestCluster, type TestCluster } from './support/cluster.ts';
import { layerTar } from './support/oci.ts';

const MiB = 1024 * 1024;
/** Generous: before this work a 1M-entry layer took the gateway up 1.2 GiB, the reads 2.1 GiB. */
const MAX_GROWTH_MIB = 300;
const ENTRIES = 1_000_000;
const READS = 64;
const RANGE_BYTES = 16 * MiB;
const BLOB_BYTES = 64 * MiB;

let cluster: TestCluster;
let gateway: { pid: number; url: string };
let writer: string;
let sandboxToken: string;

beforeAll(async () => {
  cluster = await startTestCluster();
  // Reads past 8 for one token wait at most 1 s, then 503: the refusal is met for sure.
  const spawned = await cluster.spawnGateway({ name: 'gw-memory', env: { ROLLBOX_LAYER_READS_PER_TOKEN: '8', ROLLBOX_LAYER_READS_QUEUE_MS: '1000' } });
  gateway = { pid: spawned.child.pid!, url: spawned.url };
  // One tenant writes the layers, and its sandbox-scope token reads them.
  writer = await cluster.token('tenant-b', ['layer:write']);
  sandboxToken = await cluster.token('tenant-b', ['sandbox:create']);
}, 120_000);
afterAll(async () => cluster?.stop());

/** VmRSS and VmHWM (peak) of the gateway, in MiB. */
function memoryMiB(): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${gateway.pid}/status`, 'utf8');
  const kib = (field: string): number => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)![1]) / 1024;
  return { rss: Math.round(kib('VmRSS')), peak: Math.round(kib('VmHWM')) };
}

/** Its RSS now, its peak reset to it. */
function baseline(): number {
  writeFileSync(`/proc/${gateway.pid}/clear_refs`, '5');
  return memoryMiB().rss;
}

/** One ustar header of an empty regular file (a template with its name and checksum patched). */
const TEMPLATE = (() => {
  const h = Buffer.alloc(512);
  h.write('0000644\0', 100);
  h.write('0000000\0', 108);
  h.write('0000000\0', 116);
  h.write('00000000000\0', 124);
  h.write('00000000000\0', 136);
  h.write('0', 156);
  h.write('ustar\0' + '00', 257);
  return h;
})();
const TEMPLATE_SUM = TEMPLATE.reduce((s, b) => s + b, 0) + 8 * 32;

/** A tar of `count` empty files, 1,000 to a directory, made as it is read. */
function manyFiles(count: number): ReadableStream<Uint8Array> {
  let i = 0;
  return new ReadableStream({
    pull(controller) {
      const batch = Math.min(2048, count - i);
      if (batch <= 0) {
        controller.enqueue(new Uint8Array(1024));
        controller.close();
        return;
      }
      const out = Buffer.alloc(batch * 512);
      for (let k = 0; k < batch; k++, i++) {
        const h = out.subarray(k * 512, (k + 1) * 512);
        TEMPLATE.copy(h);
        const nameLength = h.write(`d${Math.floor(i / 1000)}/f${i}`, 0, 100);
        let sum = TEMPLATE_SUM;
        for (let b = 0; b < nameLength; b++) sum += h[b]!;
        h.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148);
      }
      controller.enqueue(out);
    },
  });
}

async function upload(body: BodyInit | ReadableStream<Uint8Array>): Promise<{ status: number; json: { digest?: string; error?: { code: string } } }> {
  const response = await fetch(`${gateway.url}/v1/layers`, { method: 'POST', headers: { authorization: `Bearer ${writer}`, 'content-type': 'application/x-tar' }, body: body as BodyInit, duplex: 'half' } as RequestInit);
  return { status: response.status, json: (await response.json()) as { digest?: string } };
}

describe('gateway memory', () => {
  it(`builds a layer of ${ENTRIES} entries and serves ${READS} 16 MiB gzipped range reads at once within ${MAX_GROWTH_MIB} MiB; reads past the caps are refused retryably and the lazy fetcher retries them`, async () => {
    // Warm: a layer with a 64 MiB file (its contents are the blob the reads take, from byte 0), a small one of many entries.
    const data = randomBytes(BLOB_BYTES);
    const big = await upload(new Uint8Array(await layerTar([{ name: 'data', content: data }])));
    expect(big.status).toBe(201);
    const digest = big.json.digest!;
    expect((await upload(manyFiles(20_000))).status).toBe(201);
    const tableResponse = await fetch(`${gateway.url}/v1/layers/${digest}/chunks`, { headers: { authorization: `Bearer ${sandboxToken}` } });
    const table: LayerChunkTable = parseChunkTable(Buffer.from(await tableResponse.arrayBuffer()), digest);

    // 1. A layer of 1,000,000 empty files.
    const before = baseline();
    const started = Date.now();
    const many = await upload(manyFiles(ENTRIES));
    const built = memoryMiB();
    console.log(`1M-entry layer: ${many.status} in ${Date.now() - started} ms; gateway RSS ${before} MiB before, peak ${built.peak} MiB (+${built.peak - before}), ${built.rss} MiB after`);
    expect(many.status).toBe(201);
    expect(built.peak - before).toBeLessThan(MAX_GROWTH_MIB);

    // 2. 64 gzipped 16 MiB range reads at once by one sandbox-scope token.
    const readsBefore = baseline();
    const ranges = Array.from({ length: READS }, (_, i) => (i % (BLOB_BYTES / RANGE_BYTES)) * RANGE_BYTES);
    const answers = await Promise.all(
      ranges.map(async (start) => {
        const response = await fetch(`${gateway.url}/v1/layers/${digest}/blob`, { headers: { authorization: `Bearer ${sandboxToken}`, range: `bytes=${start}-${start + RANGE_BYTES - 1}`, [CHUNK_ENCODING_HEADER]: 'gzip' } });
        const body = Buffer.from(await response.arrayBuffer());
        if (response.status === 206) expect(gunzipSync(body).equals(data.subarray(start, start + RANGE_BYTES))).toBe(true);
        else expect([response.status, JSON.parse(body.toString()).error.code, response.headers.get('retry-after')]).toEqual([503, 'unavailable', '1']);
        return response.status;
      }),
    );
    const read = memoryMiB();
    const refused = answers.filter((s) => s === 503).length;
    console.log(`${READS} gzipped 16 MiB ranges at once: ${READS - refused} served, ${refused} refused 503; gateway RSS ${readsBefore} MiB before, peak ${read.peak} MiB (+${read.peak - readsBefore}), ${read.rss} MiB after`);
    expect(answers.every((s) => s === 206 || s === 503)).toBe(true);
    expect(refused).toBeGreaterThan(0);
    expect(read.peak - readsBefore).toBeLessThan(MAX_GROWTH_MIB);

    // 3. The same 64 by a host's lazy fetcher (16 chunks each): every one arrives, checked, by retrying the refusals.
    const fetched = await Promise.all(
      ranges.map((start) => fetchChunks(digest, table, start / table.chunkSizeBytes, RANGE_BYTES / table.chunkSizeBytes, { gatewayUrl: gateway.url, token: sandboxToken, timeoutMs: 30_000, busyRetryMs: 120_000 })),
    );
    expect(fetched.every((chunks, i) => Buffer.concat(chunks).equals(data.subarray(ranges[i]!, ranges[i]! + RANGE_BYTES)))).toBe(true);
    const after = memoryMiB();
    console.log(`the lazy fetcher's ${READS}: all served; gateway RSS peak ${after.peak} MiB (+${after.peak - readsBefore}), ${after.rss} MiB after`);
    expect(after.peak - readsBefore).toBeLessThan(MAX_GROWTH_MIB);
  }, 600_000);
});

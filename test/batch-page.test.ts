import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch } from '../src/api/index.ts';
import { launchChromium, type CdpPage, type Chromium } from './support/cdp.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

// The batch page (GET /ui) in a real headless Chromium, against a real cluster: what a
// submitter sees is what the API says, markup in a task's output stays text, and the
// page cancels a running batch.

const XSS = '<img src=x onerror=alert(1)>';
const SCREENSHOT = path.join(import.meta.dirname, 'artifacts', 'batch-page.png');

let cluster: TestCluster;
let chromium: Chromium | undefined;
let token: string;

const step = (cmd: string, timeoutMs = 20_000) => ({ cmd, timeoutMs });
const q = (s: string) => JSON.stringify(s);

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'page-node' }], env: { ROLLBOX_BATCH_SLOTS: '8' } });
  token = await cluster.token('page-tenant', ['batch:submit']);
}, 120_000);
afterAll(async () => {
  await chromium?.close();
  await cluster?.stop();
});

describe('the batch page', () => {
  it('is public HTML with a strict policy, while the API it calls still wants a token', async () => {
    for (const p of ['/ui', '/ui/']) {
      const r = await fetch(`${cluster.url}${p}`);
      expect(r.status).toBe(200);
      expect(r.headers.get('content-type')).toMatch(/^text\/html/);
      expect(r.headers.get('content-security-policy')).toMatch(/script-src 'sha256-[^']+'/);
      expect(await r.text()).toMatch(/<title>rollbox batches<\/title>/);
    }
    expect((await api(cluster, undefined, 'GET', '/v1/batches')).status).toBe(401);
  });

  it('shows each batch with its progress and counts, its failed and slowest tasks, and cancels a running one', async () => {
    const mixed = await api<Batch>(cluster, token, 'POST', '/v1/batches', {
      maxConcurrency: 4,
      metadata: { suite: 'page' },
      tasks: [
        ...['ok-1', 'ok-2', 'ok-3'].map((customId) => ({ customId, steps: [step('echo ok')] })),
        { customId: 'exit-3', steps: [step('echo broken >&2; exit 3')] },
        { customId: 'markup', steps: [step(`echo '${XSS}' >&2; exit 3`)] },
        { customId: 'too-slow', steps: [step('sleep 5', 300)] },
      ],
    });
    expect(mixed.status).toBe(201);
    const id = mixed.body.id;
    const batch = await waitFor('the mixed batch to complete', async () => {
      const b = (await api<Batch>(cluster, token, 'GET', `/v1/batches/${id}`)).body;
      return b.state === 'completed' && b;
    }, 120_000);
    expect(batch.counts).toMatchObject({ total: 6, succeeded: 3, failed: 2, timeout: 1 });
    // A batch that stays running until the page cancels it.
    const long = await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks: [{ customId: 'sleeper', steps: [step('sleep 120', 600_000)] }] });
    expect(long.status).toBe(201);

    chromium = await launchChromium();
    const page: CdpPage = await chromium.newPage({ width: 1280, height: 900 });
    await page.navigate(`${cluster.url}/ui#token=${encodeURIComponent(token)}`);
    const row = `li.batch[data-batch-id=${q(id)}]`;
    await page.waitFor('the batch listed', `!!document.querySelector(${q(row)})`);
    // The token left the address bar for sessionStorage.
    expect(await page.evaluate('location.hash')).not.toContain('token');
    expect(await page.evaluate(`sessionStorage.getItem('rollbox.token') === ${q(token)}`)).toBe(true);

    const listed = await page.evaluate(`(() => {
      const row = document.querySelector(${q(row)});
      const bar = row.querySelector('[role=progressbar]');
      return {
        text: row.textContent,
        done: bar.getAttribute('aria-valuenow'), total: bar.getAttribute('aria-valuemax'),
        segments: [...bar.querySelectorAll('.seg')].map((s) => [s.dataset.status, parseFloat(s.style.width)]),
        counts: Object.fromEntries([...row.querySelectorAll('[data-count]')].map((c) => [c.dataset.count, Number(c.querySelector('b').textContent)])),
        throughput: row.querySelector('[data-throughput]').textContent,
      };
    })()`);
    expect(listed.text).toContain(id);
    expect(listed.text).toContain('suite=page');
    expect(listed).toMatchObject({ done: '6', total: '6' });
    expect(listed.segments).toEqual([['succeeded', 50], ['failed', 33.33], ['timeout', 16.67]]);
    const { total: _total, ...apiCounts } = batch.counts;
    expect(listed.counts).toEqual(apiCounts);
    expect(listed.throughput).toMatch(/tasks\/s$/);

    // Select it: its details, read from /results to the end.
    await page.click(row);
    const detail = `#detail[data-batch-id=${q(id)}][data-complete]`;
    await page.waitFor('the batch details', `!!document.querySelector(${q(detail)})`);
    const shown = await page.evaluate(`(() => {
      const d = document.querySelector('#detail');
      return {
        state: d.querySelector('[data-state]').dataset.state,
        counts: Object.fromEntries([...d.querySelectorAll('[data-count]')].map((c) => [c.dataset.count, Number(c.querySelector('b').textContent)])),
        failed: [...d.querySelectorAll('#failed tr[data-custom-id]')].map((r) => [r.dataset.customId, r.textContent]),
        slowest: [...d.querySelectorAll('tr[data-custom-id][data-duration-ms]')].map((r) => [r.dataset.customId, Number(r.dataset.durationMs)]),
        cancel: !!d.querySelector('#cancel'),
        selected: document.querySelector('li.batch.selected')?.dataset.batchId,
        hash: location.hash,
        text: d.textContent,
      };
    })()`);
    expect(shown).toMatchObject({ state: 'completed', counts: apiCounts, cancel: false, selected: id, hash: `#batch=${id}` });
    // Every field filled from the API: no 'undefined', 'null' or NaN rendered.
    expect(shown.text + listed.text).not.toMatch(/undefined|null|NaN/);
    expect(shown.failed.map(([customId]: string[]) => customId).sort()).toEqual(['exit-3', 'markup', 'too-slow']);
    const failedText = Object.fromEntries(shown.failed);
    expect(failedText['exit-3']).toMatch(/exit 3.*broken/s);
    expect(failedText['too-slow']).toMatch(/timed out/);
    expect(shown.slowest.map(([customId]: [string]) => customId).sort()).toEqual(['exit-3', 'markup', 'ok-1', 'ok-2', 'ok-3', 'too-slow']);
    const durations = shown.slowest.map(([, ms]: [string, number]) => ms);
    expect(durations).toEqual([...durations].sort((a, b) => b - a));

    // Markup in a task's stderr is shown as text: no element made of it, nothing run.
    expect(failedText.markup).toContain(XSS);
    expect(await page.evaluate(`document.querySelectorAll('img').length`)).toBe(0);
    expect(await page.evaluate(`[...document.querySelectorAll('#failed pre')].some((p) => p.textContent.includes(${q(XSS)}) && p.children.length === 0)`)).toBe(true);
    expect(page.dialogs).toEqual([]);
    expect(page.exceptions).toEqual([]);

    const png = await page.screenshot(SCREENSHOT);
    expect(png.subarray(1, 4).toString()).toBe('PNG');

    // The running batch: the page follows it and cancels it (answering its confirm).
    const longRow = `li.batch[data-batch-id=${q(long.body.id)}]`;
    await page.waitFor('the running batch listed', `document.querySelector(${q(longRow)})?.dataset.state === 'in_progress'`);
    await page.click(longRow);
    await page.waitFor('its Cancel button', `!!document.querySelector('#detail[data-batch-id=${long.body.id}] #cancel')`);
    await page.click('#cancel');
    await waitFor('the batch cancelled through the page', async () => ['cancelling', 'cancelled'].includes((await api<Batch>(cluster, token, 'GET', `/v1/batches/${long.body.id}`)).body.state));
    expect(page.dialogs).toEqual([{ type: 'confirm', message: expect.stringContaining(long.body.id) }]);
    await page.waitFor('the page showing it cancelled', `document.querySelector('#detail [data-state]')?.dataset.state === 'cancelled' && !document.querySelector('#cancel')`, 60_000);
    expect(page.exceptions).toEqual([]);
  }, 240_000);
});

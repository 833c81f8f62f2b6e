/**
 * Every kind of chart rollbox draws, fed the shapes the benches and sweeps feed it (a
 * bench:batch progress chart's hundreds of samples, latency tails over five decades, bar
 * labels and byte counts as long as bench:import's, a burst sweep's three panels), rendered
 * in headless Chromium: no two labels overlap, none leaves the chart, no legend sits on a
 * plot. A screenshot of them goes to test/artifacts.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SweepRow } from '../src/burst/sim/sweep.ts';
import { sweepSvg } from '../src/burst/sim/sweep.ts';
import { barChartsSvg, cdfChartSvg, lineChartsSvg } from '../src/report/index.ts';
import { launchChromium, type Chromium } from './support/cdp.ts';

let chromium: Chromium;
let dir: string;

beforeAll(async () => {
  chromium = await launchChromium();
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-charts-'));
}, 60_000);
afterAll(async () => {
  await chromium?.close();
  if (dir) await fs.rm(dir, { recursive: true, force: true });
});

const seeded = (seed: number) => () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);

function charts(): Record<string, string> {
  const r = seeded(7);
  const tail = (base: number, n: number) => Array.from({ length: n }, () => base * Math.exp(r() * r() * 9));
  const progress = Array.from({ length: 240 }, (_, i) => ({ x: Math.round(i * 0.37 * 100) / 100, y: Math.min(5000, i * 21) }));
  const sweepRows: SweepRow[] = [0, 2, 4, 8].flatMap((cap) =>
    [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1].map((t) => ({
      divertAboveUtilization: t,
      stopBelowUtilization: t - 0.1,
      gap: 0.1,
      maxCloudHosts: cap,
      result: { queueWaitP99Ms: 120_000 * t * (1 / (1 + cap)), cloudVmHours: cap * (1 - t) * 3.3, overflowAbsorbedShare: cap ? 1 - t / 2 : 0 } as SweepRow['result'],
    })),
  );
  return {
    cdf: cdfChartSvg('exec latency through the API, raw runc exec, and a long-tailed third', [
      { label: 'rollbox exec of `true` (8 at once, 500 sandboxes live)', samplesMs: tail(4, 2000) },
      { label: 'raw runc exec', samplesMs: tail(15, 2000) },
      { label: 'through the E2B SDK', samplesMs: tail(0.3, 500) },
      { label: 'python client', samplesMs: tail(40, 300) },
    ]),
    batchProgress: lineChartsSvg('Evaluation batches of 5000 tasks (`true`), 12 slots', 'seconds since submit', [
      { title: 'tasks done', yLabel: 'tasks', series: [{ label: 'succeeded', points: progress }, { label: 'failed', points: progress.map((p) => ({ ...p, y: p.y / 40 })) }] },
      { title: 'tasks running and waiting for a slot', yLabel: 'tasks', series: [{ label: 'running', points: progress.map((p) => ({ ...p, y: 12 })) }, { label: 'queued (no room yet)', points: progress.map((p) => ({ ...p, y: 5000 - p.y })) }] },
    ]),
    density: lineChartsSvg('Idle cost against live sandboxes', 'live idle sandboxes', [
      { title: 'rollbox CPU at idle', yLabel: 'cores', series: [{ label: 'rollbox processes', points: [{ x: 10, y: 0.027 }, { x: 1000, y: 0.022 }, { x: 3200, y: 0.042 }] }] },
      { title: 'exec of true, p50 and p99, first exec into each and again', yLabel: 'ms', series: ['first p50', 'first p99', 'again p50', 'again p99', 'raw runc exec p50', 'raw runc exec p99', 'Docker Engine API exec p50'].map((label, i) => ({ label, points: [{ x: 10, y: 9 + i }, { x: 1000, y: 12 + i * 3 }, { x: 3200, y: 20 + i * 5 }] })) },
    ]),
    bars: barChartsSvg('Image import and pull (image A, 4 layers, 290 MiB)', [
      { title: 'pull from a loopback registry, MB/s of compressed blobs', yLabel: 'MB/s', bars: [{ label: 'skopeo copy to dir:', value: 132.53 }, { label: 'rollbox client, blobs only', value: 129.19 }, { label: 'rollbox image pull', value: 9 }, { label: 'image pull, trees on disk', value: 5.04 }] },
      { title: 'bytes written to the hosts\u2019 disks for layers, per arm', yLabel: 'bytes', bars: [{ label: 'pre-placed', value: 4636672 }, { label: 'full copy', value: 5892260202 }, { label: 'on demand', value: 1198145898 }, { label: 'on demand with prefetch lists', value: 1253388288 }, { label: 'x', value: 17 }] },
    ]),
    sweep: sweepSvg(sweepRows, 0.1, 'a day of creates from the trace recorder, 2026-11-28 (48 worker hosts)'),
  };
}

describe('charts', () => {
  it('render with no overlapping labels, nothing outside the chart, and no legend on a plot', async () => {
    const all = charts();
    const html = `<!doctype html><meta charset="utf-8"><body style="margin:0">${Object.entries(all).map(([name, svg]) => `<div data-chart="${name}">${svg}</div>`).join('\n')}</body>`;
    const file = path.join(dir, 'charts.html');
    await fs.writeFile(file, html);
    const page = await chromium.newPage({ width: 1400, height: 1000 });
    await page.navigate(`file://${file}`);
    const problems = await page.evaluate<string[]>(`(() => {
      const out = [];
      const hit = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
      for (const div of document.querySelectorAll('[data-chart]')) {
        const name = div.dataset.chart;
        const svg = div.querySelector('svg').getBoundingClientRect();
        const texts = [...div.querySelectorAll('text')].map((t) => ({ text: t.textContent, legend: t.classList.contains('legend'), box: t.getBoundingClientRect() })).filter((t) => t.text.trim() !== '');
        const plots = [...div.querySelectorAll('rect.plot')].map((p) => p.getBoundingClientRect());
        if (!plots.length) out.push(name + ': no plot area marked');
        texts.forEach((a, i) => {
          const b = a.box;
          if (b.left < svg.left - 0.5 || b.right > svg.right + 0.5 || b.top < svg.top - 0.5 || b.bottom > svg.bottom + 0.5) out.push(name + ': "' + a.text + '" leaves the chart');
          if (a.legend && plots.some((p) => hit(b, p))) out.push(name + ': legend "' + a.text + '" sits on a plot');
          for (const c of texts.slice(i + 1)) if (hit(b, c.box)) out.push(name + ': "' + a.text + '" overlaps "' + c.text + '"');
        });
      }
      return out;
    })()`);
    await page.screenshot(path.join(import.meta.dirname, 'artifacts', 'charts.png'));
    expect(problems).toEqual([]);
  }, 60_000);

  it('thin a crowded axis to round values and keep every measured level of a sparse one', () => {
    const { batchProgress, density } = charts() as { batchProgress: string; density: string };
    const xLabels = (svg: string) => [...svg.matchAll(/<text x="[\d.]+" y="[\d.]+" text-anchor="middle">([\d.kMG]+)<\/text>/g)].map((m) => m[1]);
    const crowded = xLabels(batchProgress);
    expect(crowded.length).toBeLessThan(20);
    expect(crowded.slice(0, 4)).toEqual(['0', '20', '40', '60']);
    expect(xLabels(density)).toEqual(expect.arrayContaining(['10', '1000', '3200']));
  });
});

import fs from 'node:fs';
import path from 'node:path';

/**
 * Hand-written SVG charts (no plotting dependency): latency distributions for the
 * benchmarks and line panels for the burst sweep, in one look.
 */

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2'];
const colorOf = (i: number) => COLORS[i % COLORS.length]!;

export interface LatencySeries {
  label: string;
  samplesMs: readonly number[];
}

export interface Panel {
  title: string;
  yLabel: string;
  series: { label: string; points: { x: number; y: number }[] }[];
}

/**
 * The latency distributions as empirical CDFs on a log-scaled x axis: the shape of the
 * tail shows what p50/p99 alone hide.
 */
export function cdfChartSvg(title: string, series: readonly LatencySeries[]): string {
  const width = 720;
  const height = 420;
  const margin = { left: 60, right: 20, top: 40, bottom: 50 };
  const all = series.flatMap((s) => s.samplesMs).filter((v) => v > 0);
  const minMs = Math.max(0.1, Math.min(...all));
  const maxMs = Math.max(...all);
  const logMin = Math.log10(minMs * 0.9);
  const logMax = Math.log10(maxMs * 1.1);
  const x = (ms: number) => margin.left + ((Math.log10(Math.max(ms, minMs)) - logMin) / (logMax - logMin)) * (width - margin.left - margin.right);
  const y = (fraction: number) => height - margin.bottom - fraction * (height - margin.top - margin.bottom);
  const parts = frame(width, height, title);
  for (let decade = Math.floor(logMin); decade <= Math.ceil(logMax); decade++) {
    for (const m of [1, 2, 5]) {
      const ms = m * 10 ** decade;
      if (Math.log10(ms) >= logMin && Math.log10(ms) <= logMax) parts.push(...verticalGrid(x(ms), y(1), y(0), String(ms)));
    }
  }
  for (const f of [0, 0.25, 0.5, 0.75, 0.9, 0.99, 1]) parts.push(...horizontalGrid(y(f), margin.left, width - margin.right, String(f)));
  parts.push(...axisLabels({ x: width / 2, y: height - 12 }, 'latency, ms (log scale)', { x: 16, y: height / 2 }, 'fraction of requests ≤ x'));
  series.forEach((s, i) => {
    const sorted = [...s.samplesMs].sort((a, b) => a - b);
    parts.push(polyline(colorOf(i), sorted.map((ms, j) => ({ x: x(ms), y: y((j + 1) / sorted.length) }))));
    parts.push(...legendItem(colorOf(i), margin.left + 10, margin.top + 16 + i * 18, `${s.label} (n=${sorted.length})`));
  });
  return close(parts);
}

/** Several panels side by side sharing an x axis, one line (with points) per series. */
export function lineChartsSvg(title: string, xLabel: string, panels: readonly Panel[]): string {
  const panelWidth = 420;
  const margin = { left: 70, right: 20, top: 50, bottom: 80 };
  const legends = panels.map((p) => legendRows(p.series.map((s) => s.label), panelWidth - margin.left - margin.right));
  const extraRows = Math.max(0, ...legends.map((l) => (l.length ? l[l.length - 1]!.row : 0)));
  const height = 400 + extraRows * 16;
  const parts = frame(panelWidth * panels.length, height, title);
  panels.forEach((panel, p) => {
    const left = p * panelWidth + margin.left;
    const right = (p + 1) * panelWidth - margin.right;
    const top = margin.top;
    const bottom = 400 - margin.bottom;
    const all = panel.series.flatMap((s) => s.points);
    const xMin = Math.min(...all.map((q) => q.x));
    const xMax = Math.max(...all.map((q) => q.x));
    const yMax = niceCeil(Math.max(...all.map((q) => q.y), 0));
    const x = (v: number) => left + (xMax === xMin ? 0.5 : (v - xMin) / (xMax - xMin)) * (right - left);
    const y = (v: number) => bottom - (yMax === 0 ? 0 : v / yMax) * (bottom - top);
    parts.push(`<text x="${(left + right) / 2}" y="${top - 12}" text-anchor="middle" font-size="13">${escapeXml(panel.title)}</text>`);
    for (let i = 0; i <= 4; i++) parts.push(...horizontalGrid(y((yMax * i) / 4), left, right, formatNumber((yMax * i) / 4)));
    for (const v of [...new Set(all.map((q) => q.x))].sort((a, b) => a - b)) parts.push(...verticalGrid(x(v), top, bottom, formatNumber(v)));
    parts.push(...axisLabels({ x: (left + right) / 2, y: bottom + 34 }, xLabel, { x: left - 52, y: (top + bottom) / 2 }, panel.yLabel));
    const legend = legends[p]!;
    panel.series.forEach((s, i) => {
      const points = [...s.points].sort((a, b) => a.x - b.x).map((q) => ({ x: x(q.x), y: y(q.y) }));
      parts.push(polyline(colorOf(i), points));
      for (const q of points) parts.push(`<circle cx="${q.x.toFixed(1)}" cy="${q.y.toFixed(1)}" r="3" fill="${colorOf(i)}"/>`);
      parts.push(...legendItem(colorOf(i), left + legend[i]!.x, bottom + 50 + legend[i]!.row * 16, s.label));
    });
  });
  return close(parts);
}

/** Write a chart, creating its folder; returns the path (benches print it). */
export function writeSvg(file: string, svg: string): string {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, svg);
  return file;
}

export function writeCdfChart(file: string, title: string, series: readonly LatencySeries[]): string {
  return writeSvg(file, cdfChartSvg(title, series));
}

function frame(width: number, height: number, title: string): string[] {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="${width / 2}" y="20" text-anchor="middle" font-size="15">${escapeXml(title)}</text>`,
  ];
}

function close(parts: string[]): string {
  return `${[...parts, '</svg>'].join('\n')}\n`;
}

function horizontalGrid(y: number, left: number, right: number, label: string): string[] {
  return [`<line x1="${left}" x2="${right}" y1="${y}" y2="${y}" stroke="#eee"/>`, `<text x="${left - 6}" y="${y + 4}" text-anchor="end">${label}</text>`];
}

function verticalGrid(x: number, top: number, bottom: number, label: string): string[] {
  return [`<line x1="${x}" x2="${x}" y1="${top}" y2="${bottom}" stroke="#eee"/>`, `<text x="${x}" y="${bottom + 16}" text-anchor="middle">${label}</text>`];
}

function axisLabels(xAt: { x: number; y: number }, xLabel: string, yAt: { x: number; y: number }, yLabel: string): string[] {
  return [
    `<text x="${xAt.x}" y="${xAt.y}" text-anchor="middle">${escapeXml(xLabel)}</text>`,
    `<text transform="translate(${yAt.x} ${yAt.y}) rotate(-90)" text-anchor="middle">${escapeXml(yLabel)}</text>`,
  ];
}

function polyline(color: string, points: readonly { x: number; y: number }[]): string {
  return `<polyline fill="none" stroke="${color}" stroke-width="2" points="${points.map((q) => `${q.x.toFixed(1)},${q.y.toFixed(1)}`).join(' ')}"/>`;
}

/** Where each legend entry goes (offset within the row, row) so that none overlaps the next: entries flow left to right and wrap at `width`. */
function legendRows(labels: readonly string[], width: number): { x: number; row: number }[] {
  const out: { x: number; row: number }[] = [];
  let x = 0;
  let row = 0;
  for (const label of labels) {
    // 12 px of colour, a gap, ~6.5 px per character of 12 px sans-serif, then a gap.
    const entryWidth = 16 + Math.ceil(label.length * 6.5) + 14;
    if (x > 0 && x + entryWidth > width) {
      x = 0;
      row++;
    }
    out.push({ x, row });
    x += entryWidth;
  }
  return out;
}

function legendItem(color: string, x: number, y: number, label: string): string[] {
  return [`<rect x="${x}" y="${y - 10}" width="12" height="12" fill="${color}"/>`, `<text x="${x + 16}" y="${y}">${escapeXml(label)}</text>`];
}

export interface BarPanel {
  title: string;
  yLabel: string;
  bars: { label: string; value: number }[];
}

/** Panels of bars side by side, each bar labelled with its value. */
export function barChartsSvg(title: string, panels: readonly BarPanel[]): string {
  const panelWidth = 400;
  const height = 380;
  const m = { left: 70, right: 20, top: 50, bottom: 70 };
  const parts = frame(panelWidth * panels.length, height, title);
  panels.forEach((p, i) => {
    const left = i * panelWidth + m.left;
    const right = (i + 1) * panelWidth - m.right;
    const bottom = height - m.bottom;
    const max = niceCeil(Math.max(...p.bars.map((b) => b.value), 0));
    const y = (v: number) => bottom - (v / max) * (bottom - m.top);
    parts.push(`<text x="${(left + right) / 2}" y="${m.top - 14}" text-anchor="middle" font-size="13">${escapeXml(p.title)}</text>`);
    for (let k = 0; k <= 4; k++) {
      const v = (max * k) / 4;
      parts.push(`<line x1="${left}" x2="${right}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>`, `<text x="${left - 6}" y="${y(v) + 4}" text-anchor="end">${formatNumber(v)}</text>`);
    }
    parts.push(`<text transform="translate(${left - 50} ${(m.top + bottom) / 2}) rotate(-90)" text-anchor="middle">${escapeXml(p.yLabel)}</text>`);
    const slot = (right - left) / p.bars.length;
    p.bars.forEach((b, j) => {
      const x = left + slot * j + slot * 0.15;
      const w = slot * 0.7;
      parts.push(
        `<rect x="${x.toFixed(1)}" y="${y(b.value).toFixed(1)}" width="${w.toFixed(1)}" height="${(bottom - y(b.value)).toFixed(1)}" fill="${colorOf(j)}"/>`,
        `<text x="${(x + w / 2).toFixed(1)}" y="${(y(b.value) - 5).toFixed(1)}" text-anchor="middle">${formatNumber(b.value)}</text>`,
        `<text x="${(x + w / 2).toFixed(1)}" y="${bottom + 18}" text-anchor="middle">${escapeXml(b.label)}</text>`,
      );
    });
  });
  return close(parts);
}

/** 1, 2 or 5 times a power of ten, at least v. */
function niceCeil(v: number): number {
  if (v <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(v));
  return ([1, 2, 5, 10].find((m) => m * power >= v) ?? 10) * power;
}

function formatNumber(v: number): string {
  return Math.abs(v) >= 1000 ? v.toFixed(0) : String(Number(v.toPrecision(3)));
}

function escapeXml(text: string): string {
  return text.replace(/[<>&"]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;' })[c]!);
}

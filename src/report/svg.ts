import fs from 'node:fs';
import path from 'node:path';

/**
 * Hand-written SVG charts (no plotting dependency): latency distributions for the
 * benchmarks and line panels for the burst sweep, in one look.
 */

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2'];
const colorOf = (i: number) => COLORS[i % COLORS.length]!;

const CDF_POINTS = 2000;

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
  const plotBottom = 370;
  const margin = { left: 60, right: 20, top: 40 };
  const legend = legendRows(series.map((s) => `${s.label} (n=${s.samplesMs.length})`), width - margin.left - margin.right);
  const height = plotBottom + 60 + (legend.length ? legend[legend.length - 1]!.row + 1 : 0) * LEGEND_ROW_PX;
  const sortedSeries = series.map((s) => [...s.samplesMs].sort((a, b) => a - b));
  // Ends of the sorted samples, not Math.min(...all): spreading 130,000 samples overflows the stack (bench:scale).
  const minMs = Math.max(0.1, sortedSeries.reduce((m, sorted) => Math.min(m, sorted.find((v) => v > 0) ?? Infinity), Infinity));
  const maxMs = sortedSeries.reduce((m, sorted) => Math.max(m, sorted[sorted.length - 1] ?? 0), 0);
  const logMin = Math.log10(minMs * 0.9);
  const logMax = Math.log10(maxMs * 1.1);
  const x = (ms: number) => margin.left + ((Math.log10(Math.max(ms, minMs)) - logMin) / (logMax - logMin)) * (width - margin.left - margin.right);
  const y = (fraction: number) => plotBottom - fraction * (plotBottom - margin.top);
  const parts = frame(width, height, title);
  parts.push(plotArea(margin.left, margin.top, width - margin.right, plotBottom));
  const xTicks: Tick[] = [];
  for (let decade = Math.floor(logMin); decade <= Math.ceil(logMax); decade++) {
    for (const m of [1, 2, 5]) {
      const ms = m * 10 ** decade;
      if (Math.log10(ms) >= logMin && Math.log10(ms) <= logMax) xTicks.push({ at: x(ms), label: formatNumber(ms), major: m === 1 });
    }
  }
  parts.push(...verticalGrids(xTicks, margin.top, plotBottom));
  parts.push(...horizontalGrids([0, 0.25, 0.5, 0.75, 0.9, 0.99, 1].map((f) => ({ at: y(f), label: String(f), major: f === 0 || f === 1 })), margin.left, width - margin.right));
  parts.push(...axisLabels({ x: width / 2, y: plotBottom + 36 }, 'latency, ms (log scale)', { x: 16, y: (margin.top + plotBottom) / 2 }, 'fraction of requests ≤ x'));
  series.forEach((s, i) => {
    const sorted = sortedSeries[i]!;
    // At most CDF_POINTS points a line, evenly through the sorted samples: the shape is the same, the file stays small.
    const count = Math.min(sorted.length, CDF_POINTS);
    const step = (sorted.length - 1) / Math.max(1, count - 1);
    const at = Array.from({ length: count }, (_, k) => Math.round(k * step));
    parts.push(polyline(colorOf(i), at.map((j) => ({ x: x(sorted[j]!), y: y((j + 1) / sorted.length) }))));
    parts.push(...legendItem(colorOf(i), margin.left + legend[i]!.x, plotBottom + 60 + legend[i]!.row * LEGEND_ROW_PX, `${s.label} (n=${sorted.length})`));
  });
  return close(parts);
}

/** Several panels side by side sharing an x axis, one line (with points) per series. */
export function lineChartsSvg(title: string, xLabel: string, panels: readonly Panel[]): string {
  const panelWidth = 420;
  const margin = { left: 70, right: 20 };
  const plotWidth = panelWidth - margin.left - margin.right;
  const titles = panels.map((p) => wrapText(p.title, plotWidth, TITLE_CHAR_PX));
  const top = 50 + (Math.max(1, ...titles.map((t) => t.length)) - 1) * LINE_PX;
  const bottom = top + 270;
  const legends = panels.map((p) => legendRows(p.series.map((s) => s.label), plotWidth));
  const legendLines = Math.max(0, ...legends.map((l) => (l.length ? l[l.length - 1]!.row + 1 : 0)));
  const height = bottom + 60 + legendLines * LEGEND_ROW_PX;
  const parts = frame(panelWidth * panels.length, height, title);
  panels.forEach((panel, p) => {
    const left = p * panelWidth + margin.left;
    const right = (p + 1) * panelWidth - margin.right;
    const all = panel.series.flatMap((s) => s.points);
    const xMin = Math.min(...all.map((q) => q.x));
    const xMax = Math.max(...all.map((q) => q.x));
    const yMax = niceCeil(Math.max(...all.map((q) => q.y), 0));
    const x = (v: number) => left + (xMax === xMin ? 0.5 : (v - xMin) / (xMax - xMin)) * (right - left);
    const y = (v: number) => bottom - (yMax === 0 ? 0 : v / yMax) * (bottom - top);
    parts.push(...titleLines(titles[p]!, (left + right) / 2, top - 12));
    parts.push(plotArea(left, top, right, bottom));
    parts.push(...horizontalGrids([0, 1, 2, 3, 4].map((i) => ({ at: y((yMax * i) / 4), label: formatNumber((yMax * i) / 4) })), left, right));
    parts.push(...verticalGrids(xTicksOf([...new Set(all.map((q) => q.x))].sort((a, b) => a - b), xMin, xMax, x), top, bottom));
    parts.push(...axisLabels({ x: (left + right) / 2, y: bottom + 36 }, xLabel, { x: left - 52, y: (top + bottom) / 2 }, panel.yLabel));
    const legend = legends[p]!;
    panel.series.forEach((s, i) => {
      const points = [...s.points].sort((a, b) => a.x - b.x).map((q) => ({ x: x(q.x), y: y(q.y) }));
      parts.push(polyline(colorOf(i), points));
      // Points are drawn only where there are few enough to tell apart.
      if (points.length <= plotWidth / 8) for (const q of points) parts.push(`<circle cx="${q.x.toFixed(1)}" cy="${q.y.toFixed(1)}" r="3" fill="${colorOf(i)}"/>`);
      parts.push(...legendItem(colorOf(i), left + legend[i]!.x, bottom + 60 + legend[i]!.row * LEGEND_ROW_PX, s.label));
    });
  });
  return close(parts);
}

/**
 * The x axis's ticks: the data's own x values when their labels fit side by side (a few
 * measured levels say most), else round values (1, 2 or 5 times a power of ten apart).
 */
function xTicksOf(values: readonly number[], min: number, max: number, x: (v: number) => number): Tick[] {
  const own = values.map((v) => ({ at: x(v), label: formatNumber(v) }));
  if (thinned(own).length === own.length) return own;
  const span = max - min;
  const step = niceCeil(span / 6);
  const ticks: Tick[] = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) ticks.push({ at: x(v), label: formatNumber(Number(v.toPrecision(12))) });
  return ticks;
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

interface Tick {
  at: number;
  label: string;
  /** Kept before the others when not all labels fit. */
  major?: boolean;
}

/** Pixels per character of 12 px sans-serif (wide side: digits and capitals), of 13 px titles, and per line. */
const CHAR_PX = 7.2;
const TITLE_CHAR_PX = 7.8;
const LINE_PX = 16;
const LEGEND_ROW_PX = 16;
const LABEL_GAP_PX = 8;

/**
 * Ticks whose labels do not run into each other along the axis (`extentOf`: a label's
 * extent there): majors first, then the rest where they fit.
 */
function thinned(ticks: readonly Tick[], extentOf = (t: Tick) => t.label.length * CHAR_PX): Tick[] {
  const kept: Tick[] = [];
  const fits = (t: Tick) => kept.every((k) => Math.abs(k.at - t.at) >= (extentOf(k) + extentOf(t)) / 2 + LABEL_GAP_PX);
  for (const t of ticks.filter((t) => t.major)) if (fits(t)) kept.push(t);
  for (const t of ticks.filter((t) => !t.major)) if (fits(t)) kept.push(t);
  return kept.sort((a, b) => a.at - b.at);
}

/** Grid lines at every tick; labels where they fit (12 px tall text, one above another). */
function horizontalGrids(ticks: readonly Tick[], left: number, right: number): string[] {
  const labelled = new Set(thinned(ticks, () => 12));
  return ticks.flatMap((t) => [`<line x1="${left}" x2="${right}" y1="${t.at}" y2="${t.at}" stroke="#eee"/>`, ...(labelled.has(t) ? [`<text x="${left - 6}" y="${t.at + 4}" text-anchor="end">${t.label}</text>`] : [])]);
}

function verticalGrids(ticks: readonly Tick[], top: number, bottom: number): string[] {
  const labelled = new Set(thinned(ticks));
  return ticks.flatMap((t) => [`<line x1="${t.at}" x2="${t.at}" y1="${top}" y2="${bottom}" stroke="#eee"/>`, ...(labelled.has(t) ? [`<text x="${t.at}" y="${bottom + 18}" text-anchor="middle">${t.label}</text>`] : [])]);
}

/** The plot's area, drawn as nothing: tests check that no label or legend sits on it. */
function plotArea(left: number, top: number, right: number, bottom: number): string {
  return `<rect class="plot" x="${left}" y="${top}" width="${right - left}" height="${bottom - top}" fill="none"/>`;
}

/** Words in lines of at most `widthPx` (a word longer than a line gets a line of its own). */
function wrapText(text: string, widthPx: number, charPx = CHAR_PX): string[] {
  const perLine = Math.max(1, Math.floor(widthPx / charPx));
  const lines: string[] = [];
  for (const word of text.split(/\s+/).filter(Boolean)) {
    const last = lines[lines.length - 1];
    if (last !== undefined && last.length + 1 + word.length <= perLine) lines[lines.length - 1] = `${last} ${word}`;
    else lines.push(word);
  }
  return lines.length ? lines : [''];
}

/** A title's lines, the last one's baseline at `lastY`. */
function titleLines(lines: readonly string[], x: number, lastY: number): string[] {
  return lines.map((line, i) => `<text x="${x}" y="${lastY - (lines.length - 1 - i) * LINE_PX}" text-anchor="middle" font-size="13">${escapeXml(line)}</text>`);
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
    // 12 px of colour, a gap, the text, then a gap.
    const entryWidth = 16 + Math.ceil(label.length * CHAR_PX) + 14;
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
  return [`<rect x="${x}" y="${y - 10}" width="12" height="12" fill="${color}"/>`, `<text class="legend" x="${x + 16}" y="${y}">${escapeXml(label)}</text>`];
}

export interface BarPanel {
  title: string;
  yLabel: string;
  bars: { label: string; value: number }[];
}

/** Panels of bars side by side, each bar labelled with its value; labels wrap to their bar's width. */
export function barChartsSvg(title: string, panels: readonly BarPanel[]): string {
  const panelWidth = 400;
  const m = { left: 70, right: 20 };
  const plotWidth = panelWidth - m.left - m.right;
  const titles = panels.map((p) => wrapText(p.title, plotWidth, TITLE_CHAR_PX));
  const top = 58 + (Math.max(1, ...titles.map((t) => t.length)) - 1) * LINE_PX;
  const bottom = top + 260;
  const labels = panels.map((p) => p.bars.map((b) => wrapText(b.label, plotWidth / p.bars.length - 6)));
  const labelLines = Math.max(1, ...labels.flat().map((l) => l.length));
  const height = bottom + 30 + labelLines * LINE_PX;
  const parts = frame(panelWidth * panels.length, height, title);
  panels.forEach((p, i) => {
    const left = i * panelWidth + m.left;
    const right = (i + 1) * panelWidth - m.right;
    const max = niceCeil(Math.max(...p.bars.map((b) => b.value), 0));
    const y = (v: number) => bottom - (v / max) * (bottom - top);
    parts.push(...titleLines(titles[i]!, (left + right) / 2, top - 20));
    parts.push(plotArea(left, top, right, bottom));
    parts.push(...horizontalGrids([0, 1, 2, 3, 4].map((k) => ({ at: y((max * k) / 4), label: formatNumber((max * k) / 4) })), left, right));
    parts.push(`<text transform="translate(${left - 50} ${(top + bottom) / 2}) rotate(-90)" text-anchor="middle">${escapeXml(p.yLabel)}</text>`);
    const slot = (right - left) / p.bars.length;
    p.bars.forEach((b, j) => {
      const x = left + slot * j + slot * 0.15;
      const w = slot * 0.7;
      const value = formatNumber(b.value);
      parts.push(
        `<rect x="${x.toFixed(1)}" y="${y(b.value).toFixed(1)}" width="${w.toFixed(1)}" height="${(bottom - y(b.value)).toFixed(1)}" fill="${colorOf(j)}"/>`,
        // The value above its bar, in smaller type where the bar's slot is narrow for it.
        `<text x="${(x + w / 2).toFixed(1)}" y="${(y(b.value) - 5).toFixed(1)}" text-anchor="middle"${value.length * CHAR_PX > slot - 4 ? ' font-size="10"' : ''}>${value}</text>`,
        ...labels[i]![j]!.map((line, k) => `<text x="${(x + w / 2).toFixed(1)}" y="${bottom + 18 + k * LINE_PX}" text-anchor="middle">${escapeXml(line)}</text>`),
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

/** Three significant digits; from 10,000 on with k, M or G (5892260202 -> 5.89G). */
function formatNumber(v: number): string {
  const a = Math.abs(v);
  if (a < 10_000) return a >= 1000 ? v.toFixed(0) : String(Number(v.toPrecision(3)));
  const [div, suffix] = a >= 1e9 ? [1e9, 'G'] : a >= 1e6 ? [1e6, 'M'] : [1e3, 'k'];
  return `${Number((v / div).toPrecision(3))}${suffix}`;
}

function escapeXml(text: string): string {
  return text.replace(/[<>&"]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;' })[c]!);
}

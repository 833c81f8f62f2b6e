import fs from 'node:fs';
import path from 'node:path';

export interface Series {
  label: string;
  samplesMs: readonly number[];
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd'];

/**
 * Writes an SVG of the latency distributions (empirical CDFs, log-scaled x axis): the
 * shape of the tail shows what p50/p99 alone hide.
 */
export function writeCdfChart(file: string, title: string, series: readonly Series[]): string {
  const width = 720;
  const height = 420;
  const margin = { left: 60, right: 20, top: 40, bottom: 50 };
  const all = series.flatMap((s) => s.samplesMs).filter((x) => x > 0);
  const minMs = Math.max(0.1, Math.min(...all));
  const maxMs = Math.max(...all);
  const logMin = Math.log10(minMs * 0.9);
  const logMax = Math.log10(maxMs * 1.1);
  const x = (ms: number) => margin.left + ((Math.log10(Math.max(ms, minMs)) - logMin) / (logMax - logMin)) * (width - margin.left - margin.right);
  const y = (fraction: number) => height - margin.bottom - fraction * (height - margin.top - margin.bottom);
  const parts: string[] = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`);
  parts.push(`<rect width="100%" height="100%" fill="white"/>`);
  parts.push(`<text x="${width / 2}" y="22" text-anchor="middle" font-size="15">${escapeXml(title)}</text>`);
  for (let decade = Math.floor(logMin); decade <= Math.ceil(logMax); decade++) {
    for (const m of [1, 2, 5]) {
      const ms = m * 10 ** decade;
      if (Math.log10(ms) < logMin || Math.log10(ms) > logMax) continue;
      parts.push(`<line x1="${x(ms)}" x2="${x(ms)}" y1="${y(0)}" y2="${y(1)}" stroke="#eee"/>`);
      parts.push(`<text x="${x(ms)}" y="${y(0) + 16}" text-anchor="middle">${ms}</text>`);
    }
  }
  for (const f of [0, 0.25, 0.5, 0.75, 0.9, 0.99, 1]) {
    parts.push(`<line x1="${margin.left}" x2="${width - margin.right}" y1="${y(f)}" y2="${y(f)}" stroke="#eee"/>`);
    parts.push(`<text x="${margin.left - 6}" y="${y(f) + 4}" text-anchor="end">${f}</text>`);
  }
  parts.push(`<text x="${width / 2}" y="${height - 12}" text-anchor="middle">latency, ms (log scale)</text>`);
  parts.push(`<text transform="translate(16 ${height / 2}) rotate(-90)" text-anchor="middle">fraction of requests ≤ x</text>`);
  series.forEach((s, i) => {
    const sorted = [...s.samplesMs].sort((a, b) => a - b);
    const points = sorted.map((ms, j) => `${x(ms).toFixed(1)},${y((j + 1) / sorted.length).toFixed(1)}`).join(' ');
    const color = COLORS[i % COLORS.length];
    parts.push(`<polyline fill="none" stroke="${color}" stroke-width="2" points="${points}"/>`);
    parts.push(`<rect x="${margin.left + 10}" y="${margin.top + 6 + i * 18}" width="12" height="12" fill="${color}"/>`);
    parts.push(`<text x="${margin.left + 28}" y="${margin.top + 16 + i * 18}">${escapeXml(s.label)} (n=${sorted.length})</text>`);
  });
  parts.push('</svg>');
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, parts.join('\n'));
  return file;
}

function escapeXml(text: string): string {
  return text.replace(/[<>&"]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;' })[c]!);
}

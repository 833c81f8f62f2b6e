/**
 * Hand-written SVG line charts for the burst sweep (same look as bench/support/chart.ts):
 * several panels side by side sharing an x axis, one line per series.
 */
export interface Panel {
  title: string;
  yLabel: string;
  series: { label: string; points: { x: number; y: number }[] }[];
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2'];

export function lineChartsSvg(title: string, xLabel: string, panels: readonly Panel[]): string {
  const panelWidth = 420;
  const height = 400;
  const margin = { left: 70, right: 20, top: 50, bottom: 80 };
  const width = panelWidth * panels.length;
  const parts: string[] = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" font-family="sans-serif" font-size="12">`);
  parts.push(`<rect width="100%" height="100%" fill="white"/>`);
  parts.push(`<text x="${width / 2}" y="20" text-anchor="middle" font-size="15">${escapeXml(title)}</text>`);
  panels.forEach((panel, p) => {
    const left = p * panelWidth + margin.left;
    const right = (p + 1) * panelWidth - margin.right;
    const top = margin.top;
    const bottom = height - margin.bottom;
    const all = panel.series.flatMap((s) => s.points);
    const xMin = Math.min(...all.map((q) => q.x));
    const xMax = Math.max(...all.map((q) => q.x));
    const yMax = niceCeil(Math.max(...all.map((q) => q.y), 0));
    const x = (v: number) => left + (xMax === xMin ? 0.5 : (v - xMin) / (xMax - xMin)) * (right - left);
    const y = (v: number) => bottom - (yMax === 0 ? 0 : v / yMax) * (bottom - top);
    parts.push(`<text x="${(left + right) / 2}" y="${top - 12}" text-anchor="middle" font-size="13">${escapeXml(panel.title)}</text>`);
    for (let i = 0; i <= 4; i++) {
      const v = (yMax * i) / 4;
      parts.push(`<line x1="${left}" x2="${right}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>`);
      parts.push(`<text x="${left - 6}" y="${y(v) + 4}" text-anchor="end">${formatNumber(v)}</text>`);
    }
    for (const v of [...new Set(all.map((q) => q.x))].sort((a, b) => a - b)) {
      parts.push(`<line x1="${x(v)}" x2="${x(v)}" y1="${top}" y2="${bottom}" stroke="#eee"/>`);
      parts.push(`<text x="${x(v)}" y="${bottom + 16}" text-anchor="middle">${formatNumber(v)}</text>`);
    }
    parts.push(`<text x="${(left + right) / 2}" y="${bottom + 34}" text-anchor="middle">${escapeXml(xLabel)}</text>`);
    parts.push(`<text transform="translate(${left - 52} ${(top + bottom) / 2}) rotate(-90)" text-anchor="middle">${escapeXml(panel.yLabel)}</text>`);
    panel.series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      const points = [...s.points].sort((a, b) => a.x - b.x);
      parts.push(`<polyline fill="none" stroke="${color}" stroke-width="2" points="${points.map((q) => `${x(q.x).toFixed(1)},${y(q.y).toFixed(1)}`).join(' ')}"/>`);
      for (const q of points) parts.push(`<circle cx="${x(q.x).toFixed(1)}" cy="${y(q.y).toFixed(1)}" r="3" fill="${color}"/>`);
      const legendX = left + (i % 3) * 120;
      const legendY = bottom + 50 + Math.floor(i / 3) * 16;
      parts.push(`<rect x="${legendX}" y="${legendY - 10}" width="12" height="12" fill="${color}"/>`);
      parts.push(`<text x="${legendX + 16}" y="${legendY}">${escapeXml(s.label)}</text>`);
    });
  });
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}

/** 1, 2 or 5 times a power of ten, at least v. */
function niceCeil(v: number): number {
  if (v <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(v));
  return ([1, 2, 5, 10].find((m) => m * power >= v) ?? 10) * power;
}

function formatNumber(v: number): string {
  return Math.abs(v) >= 1000 ? v.toFixed(0) : String(Math.round(v * 100) / 100);
}

function escapeXml(text: string): string {
  return text.replace(/[<>&"]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;' })[c]!);
}

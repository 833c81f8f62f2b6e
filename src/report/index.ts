/** What commands and benchmarks show people: percentiles, a progress bar, SVG charts. */
export { percentile, summarize, type LatencySummary } from './stats.ts';
export { progressBar, type ProgressBar } from './progress.ts';
export { barChartsSvg, cdfChartSvg, lineChartsSvg, writeCdfChart, writeSvg, type BarPanel, type LatencySeries, type Panel } from './svg.ts';

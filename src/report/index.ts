/** What commands and benchmarks show people: percentiles, a progress bar, SVG charts. */
export { percentile, summarize, type LatencySummary } from './stats.ts';
export { progressBar, type ProgressBar } from './progress.ts';
export { cdfChartSvg, lineChartsSvg, writeCdfChart, writeSvg, type LatencySeries, type Panel } from './svg.ts';

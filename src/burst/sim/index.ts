export { simulate } from './simulate.ts';
export type { SimulateOptions } from './simulate.ts';
export { SimModel } from './model.ts';
export type { SimResult } from './model.ts';
export { runSweep, sweepCsv, sweepSvg } from './sweep.ts';
export type { SweepGrid, SweepRow } from './sweep.ts';

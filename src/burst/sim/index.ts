export { simulate } from './simulate.ts';
export type { SimulateOptions } from './simulate.ts';
export { SimModel } from './model.ts';
export type { SimResult } from './model.ts';
export { capStepRiseLine, capStepRises, runSweep, sweepCsv, sweepSvg } from './sweep.ts';
export type { CapStepRise, SweepGrid, SweepRow } from './sweep.ts';

export { simulate } from './simulate.ts';
export type { SimulateOptions } from './simulate.ts';
export { SimModel } from './model.ts';
export type { SimResult } from './model.ts';

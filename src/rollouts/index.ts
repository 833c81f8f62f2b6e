export { interleave } from './trajectory.ts';

export { TraceRecorder, exportTrace } from './recorder.ts';
export type { ExportedTrace } from './recorder.ts';

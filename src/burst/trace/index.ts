export { generateTrace, DEFAULT_TRACE_OPTIONS } from './generate.ts';
export type { TraceGeneratorOptions } from './generate.ts';
export { traceLine, writeTraceFile, readTraceFile, parseTrace } from './file.ts';
export { TraceRecorder, exportTrace } from './recorder.ts';
export type { ExportedTrace } from './recorder.ts';

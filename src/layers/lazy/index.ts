export { LazyLayers } from './lazy-layers.ts';
export type { LazyLayersDeps, LazyLayersLogger, PrefetchStore } from './lazy-layers.ts';
export { FillQueue, fetchChunks } from './fetcher.ts';
export type { FillJob, OriginOptions } from './fetcher.ts';
export { GateClient } from './gate.ts';
export type { GateClientDeps, GateHello, GateBlob } from './gate.ts';
export { GateDecoder, encode as encodeGateMessage, GATE_PROTOCOL_VERSION } from './protocol.ts';
export type { FromGate } from './protocol.ts';

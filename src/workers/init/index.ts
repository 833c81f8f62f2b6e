import path from 'node:path';

export { InitLostError, openCommand, releaseCommands, runCommand } from './client.ts';
export type { CommandChannel, CommandHandlers, CommandOutcome, CommandStart } from './client.ts';
export type { PtySize } from './protocol.ts';
export { MAX_SOCKET_PATH_BYTES, listenForInit } from './listener.ts';
export { AUTO_SLOT } from './protocol.ts';
export type { InitListener } from './listener.ts';

/** Built from rollbox-init.c by scripts/build-init.sh (run by `npm start`, `npm test` and the benches). */
export const DEFAULT_INIT_BINARY = path.resolve(import.meta.dirname, '../../../build/rollbox-init');

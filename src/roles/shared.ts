/** What the roles share: how they log and stop, and where the layer store is. */
import pino, { type Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { LayerStore } from '../layers/index.ts';

export interface Stoppable {
  stop(): Promise<void>;
}

/** Logs go to stderr, so stdout stays for what a command prints (the `up` banner, a token). */
export function createLogger(config: Pick<Config, 'logLevel'>, name: string): Logger {
  return pino({ name, level: config.logLevel }, pino.destination({ dest: 2, sync: true }));
}

export function layerStoreOf(config: Config): LayerStore {
  return new LayerStore(config.layerStoreDir);
}

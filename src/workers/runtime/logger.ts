/** What the runtime logs through (a pino logger in production). */
export interface RuntimeLogger {
  warn(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
}

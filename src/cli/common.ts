/**
 * What the gateway client commands (`rollbox batch`, `rollbox image`) share: the connection
 * flags (--url / ROLLBOX_URL, --token / ROLLBOX_TOKEN), errors reported as
 * `rollbox: <code>: <message>` (exit 1), and stdout that waits for a full pipe.
 */
import { once } from 'node:events';
import type { Command } from 'commander';
import { RollboxApiError, RollboxClient } from '../client/index.ts';

export const DEFAULT_URL = 'http://127.0.0.1:8080';

/** An error the CLI reports as `rollbox: <code>: <message>`. */
export class CliError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export interface ConnectionFlags {
  url?: string;
  token?: string;
}

/** Adds --url and --token; `scope`: what the token needs, as the help shows it (e.g. `batch:submit`). */
export function withConnection(command: Command, scope: string): Command {
  return command.option('--url <url>', `gateway URL (env ROLLBOX_URL, default ${DEFAULT_URL})`).option('--token <token>', `API token with scope ${scope} (env ROLLBOX_TOKEN)`);
}

/** A client of the gateway the flags (or the environment) name; no token is an error before any request. */
export function connect(flags: ConnectionFlags): RollboxClient {
  const token = flags.token ?? process.env.ROLLBOX_TOKEN;
  if (!token) throw new CliError('unauthenticated', 'no token: give --token or set ROLLBOX_TOKEN');
  return new RollboxClient({ baseUrl: flags.url ?? process.env.ROLLBOX_URL ?? DEFAULT_URL, token });
}

/** Runs an action; any failure becomes `<code>: <message>` for runCli to print (and exit 1). */
export function reported<A extends unknown[]>(action: (...args: A) => Promise<void>): (...args: A) => Promise<void> {
  return async (...args) => {
    try {
      await action(...args);
    } catch (err) {
      throw new Error(describeError(err), { cause: err });
    }
  };
}

export function describeError(err: unknown): string {
  if (err instanceof RollboxApiError || err instanceof CliError) return `${err.code}: ${err.message}`;
  if (!(err instanceof Error)) return `error: ${String(err)}`;
  const code = (err as NodeJS.ErrnoException).code;
  // Node's system errors already start with their code (ENOENT: no such file...).
  return typeof code === 'string' ? (err.message.startsWith(code) ? err.message : `${code}: ${err.message}`) : `error: ${err.message}`;
}

/** Writes to stdout, waiting when the pipe is full. */
export async function out(text: string): Promise<void> {
  if (!process.stdout.write(text)) await once(process.stdout, 'drain');
}

/** Rows as columns two spaces apart (the first row: the headers); no trailing blanks. */
export function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) => r.map((cell, i) => cell.padEnd(widths[i]!)).join('  ').trimEnd()).join('\n') + '\n';
}

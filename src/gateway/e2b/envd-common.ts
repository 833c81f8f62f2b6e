import path from 'node:path';
import type { Context } from 'hono';
import type { Sandbox } from '../../api/index.ts';
import type { Principal } from '../../iam/index.ts';

/** One envd call, authenticated: whose sandbox, as whom. */
export interface EnvdCall {
  sandboxId: string;
  principal: Principal;
  /** The Linux user the SDK selected (`Authorization: Basic <user>:`); none: the sandbox's own user. */
  user: string | undefined;
  /** A service call whose "not found" or "not running" means the sandbox is gone turns into E2B's answer for that (see envd.ts). */
  guard<T>(work: Promise<T>): Promise<T>;
  /** An error that ended a command's stream, as E2B tells it when the sandbox is gone (see envd.ts). */
  explain(err: unknown): Promise<unknown>;
  /** The sandbox's record (read once per call). */
  sandbox(): Promise<Sandbox>;
}

/** The home envd gives a user: `/root` for root, `/home/<name>` for another. */
export const homeOf = (user: string) => (user === 'root' || user === '0' ? '/root' : `/home/${user.split(':')[0]}`);

/**
 * Relative paths as envd resolves them: `~` is the user's home; anything else relative is
 * under the home of the user the call names, or, naming none, under the sandbox's working
 * directory (its image's: `/home/user` in the base template, `/` in busybox).
 */
export function resolvePath(p: string, user: string | undefined, sandbox: Pick<Sandbox, 'spec'>): string {
  if (p.startsWith('/')) return path.posix.normalize(p);
  const self = user ?? sandbox.spec.user ?? 'root';
  if (p === '~' || p.startsWith('~/')) return path.posix.join(homeOf(self), p.slice(1));
  return path.posix.join(user !== undefined ? homeOf(user) : (sandbox.spec.workdir ?? '/'), p);
}

/** The user of `Authorization: Basic base64(<user>:)` (a selector, not a credential). */
export function userOf(authorization: string | undefined): string | undefined {
  const basic = authorization?.match(/^Basic\s+(\S+)$/i)?.[1];
  if (!basic) return undefined;
  const user = Buffer.from(basic, 'base64').toString('utf8').split(':')[0];
  return user || undefined;
}

/** envd's own default when the client sends no Keepalive-Ping-Interval. */
const DEFAULT_KEEPALIVE_SECONDS = 90;
/** `timeoutMs: 0` (no limit) runs as long as rollbox lets any command: a day. */
export const MAX_COMMAND_MS = 24 * 3600 * 1000;

/** The client's Keepalive-Ping-Interval (seconds), kept between 1 s and envd's default. */
export function keepaliveMsOf(c: Context): number {
  const seconds = Number(c.req.header('keepalive-ping-interval'));
  return 1000 * (Number.isFinite(seconds) && seconds >= 1 ? Math.min(seconds, DEFAULT_KEEPALIVE_SECONDS) : DEFAULT_KEEPALIVE_SECONDS);
}

/** A streaming call's Connect-Timeout-Ms as a command's timeout (none or 0: MAX_COMMAND_MS). */
export function timeoutMsOf(c: Context): number {
  const ms = Number(c.req.header('connect-timeout-ms') ?? 0);
  return ms > 0 ? Math.min(ms, MAX_COMMAND_MS) : MAX_COMMAND_MS;
}

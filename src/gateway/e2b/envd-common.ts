import path from 'node:path';
import type { Principal } from '../../iam/index.ts';

/** One envd call, authenticated: whose sandbox, as whom. */
export interface EnvdCall {
  sandboxId: string;
  principal: Principal;
  /** The Linux user the SDK selected (`Authorization: Basic <user>:`); none: the sandbox's own user. */
  user: string | undefined;
  /** A service call whose "not found" or "not running" means the sandbox is gone turns into E2B's answer for that (see envd.ts). */
  guard<T>(work: Promise<T>): Promise<T>;
}

/**
 * Relative paths, as envd resolves them, against the user's home: `/root` for root,
 * `/home/<name>` for another named user; with no user (rollbox's default: the sandbox's
 * user, root unless set), against `/`.
 */
export function resolvePath(p: string, user: string | undefined): string {
  if (p.startsWith('/')) return path.posix.normalize(p);
  const home = user === undefined ? '/' : user === 'root' || user === '0' ? '/root' : `/home/${user.split(':')[0]}`;
  return path.posix.join(home, p);
}

/** The user of `Authorization: Basic base64(<user>:)` (a selector, not a credential). */
export function userOf(authorization: string | undefined): string | undefined {
  const basic = authorization?.match(/^Basic\s+(\S+)$/i)?.[1];
  if (!basic) return undefined;
  const user = Buffer.from(basic, 'base64').toString('utf8').split(':')[0];
  return user || undefined;
}

import { isIP } from 'node:net';
import { RollboxError, type NetworkPolicy } from '../../api/index.ts';

/** E2B's egress settings, as create's `network` and updateNetwork's body give them. */
export interface E2bEgress {
  allowOut?: string[] | undefined;
  denyOut?: string[] | undefined;
  allowInternetAccess?: boolean | undefined;
}

const isCidr = (entry: string) => isIP(entry) !== 0 || (entry.includes('/') && isIP(entry.slice(0, entry.indexOf('/'))) !== 0);

/**
 * E2B's egress as rollbox's network policy, an allowlist: `allowOut` entries become allow
 * rules (CIDRs and addresses as `cidr`, names as `host`), `allow_internet_access: true`
 * with nothing listed allows everywhere (0.0.0.0/0), false allows nothing. Undefined when
 * nothing is said (rollbox's default: no network, where E2B's is the internet). What an
 * allowlist cannot say (`denyOut`, wildcard names) is refused with the difference named.
 */
export function networkOf(egress: E2bEgress): NetworkPolicy | undefined {
  if (egress.denyOut?.length) throw new RollboxError('not_implemented', "denyOut: rollbox's network policy is an allowlist (everything not allowed is denied), so it cannot deny within what it allows; list the destinations to allow in allowOut instead");
  if (egress.allowInternetAccess === false) return { mode: 'none', allow: [] };
  const allowOut = egress.allowOut ?? [];
  if (allowOut.length === 0) return egress.allowInternetAccess ? { mode: 'allowlist', allow: [{ cidr: '0.0.0.0/0', protocol: 'any' }] } : undefined;
  const allow = allowOut.map((entry) => {
    if (entry.startsWith('*')) throw new RollboxError('not_implemented', `allowOut ${entry}: rollbox allows names one by one (resolved when the policy is applied), not wildcards`);
    return isCidr(entry) ? { cidr: entry, protocol: 'any' as const } : { host: entry, protocol: 'any' as const };
  });
  return { mode: 'allowlist', allow };
}

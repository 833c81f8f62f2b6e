import { readFile } from 'node:fs/promises';
import os from 'node:os';
import type { NetworkPolicy } from '../../api/index.ts';
import { ALWAYS_BLOCKED_V4, ipv4Range, mergeRanges, normalizeCidr, parseIpv4, parsePortSpec, type ResolvedRule } from './rules.ts';

/**
 * A policy's allow entries as rules the kernel can take: hostnames resolved (by the
 * platform's resolver, once, when the policy is applied), ports parsed. `names` is what
 * the sandbox's DNS responder answers with: the same addresses the rules let through.
 */
export async function resolvePolicy(policy: NetworkPolicy, resolveHost: (name: string) => Promise<string[]>): Promise<{ rules: ResolvedRule[]; names: Map<string, string[]> }> {
  const rules: ResolvedRule[] = [];
  const names = new Map<string, string[]>();
  for (const entry of policy.allow) {
    const ports = entry.ports?.map((p) => parsePortSpec(p)).filter((p): p is [number, number] => !!p);
    const add = (cidr: string) => rules.push({ cidr, ports, protocol: entry.protocol });
    if (entry.cidr !== undefined) {
      // IPv6 entries have no effect: sandboxes have no IPv6.
      const cidr = normalizeCidr(entry.cidr);
      if (cidr) add(cidr);
      continue;
    }
    const host = entry.host!.toLowerCase();
    const ips = (await resolveHost(host).catch(() => [] as string[])).filter((ip) => parseIpv4(ip) !== undefined);
    names.set(host, [...new Set([...(names.get(host) ?? []), ...ips])]);
    for (const ip of ips) add(`${ip}/32`);
  }
  return { rules, names };
}

/** Always blocked: the fixed list, configured extras, the pool (other sandboxes), every address of this host. */
export async function blockedRanges(extraCidrs: readonly string[], poolCidr: string): Promise<[number, number][]> {
  // The host's addresses, read now without spawning anything: those the kernel delivers
  // locally (the LOCAL /32s of the routing trie, down links included) and getifaddrs.
  const hostAddrs = Object.values(os.networkInterfaces()).flatMap((addrs) => (addrs ?? []).filter((a) => a.family === 'IPv4').map((a) => a.address));
  let last = '';
  for (const line of (await readFile('/proc/net/fib_trie', 'utf8').catch(() => '')).split('\n')) {
    const leaf = /\|-- (\d+\.\d+\.\d+\.\d+)$/.exec(line);
    if (leaf) last = leaf[1]!;
    else if (/\/32 host LOCAL/.test(line) && last) hostAddrs.push(last);
  }
  const cidrs = [...ALWAYS_BLOCKED_V4, ...extraCidrs, poolCidr, ...hostAddrs];
  return mergeRanges(cidrs.map((c) => ipv4Range(c)).filter((r): r is [number, number] => !!r));
}

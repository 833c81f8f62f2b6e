import { describe, expect, it } from 'vitest';
import { iptablesRules, nftRules, parseIptablesListing, parseNftRuleset } from './host-firewall.ts';

describe('host firewall rules', () => {
  it('only ever name rollbox veths and the veth pool, and carry the node comment', () => {
    const ipt = iptablesRules('10.200.0.0/16', 'rollbox:n1');
    for (const spec of Object.values(ipt).flat()) {
      expect(spec.join(' ')).toMatch(/-[io] rb\+ /);
      expect(spec.join(' ')).toContain('10.200.0.0/16');
      expect(spec.join(' ')).toContain('--comment rollbox:n1 -j ACCEPT');
    }
    // Back to a sandbox: only flows it opened.
    expect(ipt.forward[1]!.join(' ')).toContain('--ctstate RELATED,ESTABLISHED');
    // To and from the host: DNS only.
    expect(ipt.input[0]!.join(' ')).toContain('-p udp --dport 53');
    expect(ipt.output[0]!.join(' ')).toContain('-p udp --sport 53');
    const nft = nftRules('10.200.0.0/16', 'rollbox:n1');
    for (const rule of Object.values(nft).flat()) expect(rule).toMatch(/^[io]ifname "rb\*" ip [sd]addr 10\.200\.0\.0\/16 .*accept comment "rollbox:n1"$/);
    expect(nft.forward[1]).toContain('ct state established,related');
  });

  it('reads iptables -S and nft -j listings', () => {
    const listing = parseIptablesListing(
      ['-P INPUT ACCEPT', '-P FORWARD DROP', '-N DOCKER-USER', '-A FORWARD -j DOCKER-USER', '-A DOCKER-USER -s 10.200.0.0/16 -i rb+ -m comment --comment "rollbox:n1" -j ACCEPT', '-A DOCKER-USER -j RETURN', ''].join('\n'),
    );
    expect(listing.policies.get('FORWARD')).toBe('DROP');
    expect([...listing.chains].sort()).toEqual(['DOCKER-USER', 'FORWARD', 'INPUT']);
    expect(listing.rules.get('DOCKER-USER')).toHaveLength(2);
    expect(listing.rules.get('INPUT')).toBeUndefined();

    const ruleset = parseNftRuleset(
      JSON.stringify({
        nftables: [
          { metainfo: { version: '1.0.6' } },
          { table: { family: 'inet', name: 'hostfw', handle: 1 } },
          { chain: { family: 'inet', table: 'hostfw', name: 'fw', handle: 2, type: 'filter', hook: 'forward', prio: 0, policy: 'drop' } },
          { rule: { family: 'inet', table: 'hostfw', chain: 'fw', handle: 5, comment: 'rollbox:n1', expr: [] } },
        ],
      }),
    );
    expect(ruleset.chains).toEqual([{ family: 'inet', table: 'hostfw', name: 'fw', handle: 2, type: 'filter', hook: 'forward', prio: 0, policy: 'drop' }]);
    expect(ruleset.rules.map((r) => [r.handle, r.comment])).toEqual([[5, 'rollbox:n1']]);
    expect(parseNftRuleset('')).toEqual({ chains: [], rules: [] });
  });
});

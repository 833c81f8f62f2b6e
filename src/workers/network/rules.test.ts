import { describe, expect, it } from 'vitest';
import { answer, parseQuery } from './dns.ts';
import { allows, ipv4Range, mergeRanges, normalizeCidr, parsePortSpec, renderHostSandboxChain, renderSandboxRuleset, slotOf } from './rules.ts';

function query(name: string, type = 1): Buffer {
  const labels = name.split('.').map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)]));
  return Buffer.concat([Buffer.from([0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]), ...labels, Buffer.from([0, 0, type, 0, 1])]);
}

describe('ipv4 helpers', () => {
  it('parses and normalizes CIDRs, rejecting IPv6 and junk', () => {
    expect(normalizeCidr('10.1.2.3/16')).toBe('10.1.0.0/16');
    expect(normalizeCidr('10.1.2.3')).toBe('10.1.2.3/32');
    expect(ipv4Range('0.0.0.0/0')).toEqual([0, 2 ** 32 - 1]);
    for (const bad of ['fd00::/8', '10.0.0.256', '10.0.0.1/33', '10.0.0.1/8/1', 'x']) expect(normalizeCidr(bad)).toBeUndefined();
  });
  it('merges overlapping and adjacent ranges', () => {
    expect(mergeRanges([[10, 20], [5, 12], [21, 30], [40, 41]])).toEqual([[5, 30], [40, 41]]);
  });
  it('parses ports and ranges', () => {
    expect(parsePortSpec(80)).toEqual([80, 80]);
    expect(parsePortSpec('8000-8100')).toEqual([8000, 8100]);
    expect(parsePortSpec('9-8')).toBeUndefined();
    expect(parsePortSpec(70_000)).toBeUndefined();
  });
  it('lays out the pool in /30s', () => {
    expect(slotOf('10.200.0.0/16', 0)).toEqual({ index: 0, hostAddress: '10.200.0.1', sandboxAddress: '10.200.0.2' });
    expect(slotOf('10.200.0.0/16', 64)).toEqual({ index: 64, hostAddress: '10.200.1.1', sandboxAddress: '10.200.1.2' });
  });
});

describe('allowlist semantics', () => {
  const rules = [
    { cidr: '10.9.0.0/24', ports: [[80, 80], [8000, 8100]] as [number, number][], protocol: 'tcp' as const },
    { cidr: '169.254.169.254/32', protocol: 'any' as const },
  ];
  const blocked = mergeRanges([ipv4Range('169.254.0.0/16')!]);
  it('lets through listed destinations and ports only; always-blocked wins over a listing', () => {
    expect(allows(rules, blocked, '10.9.0.7', 80, 'tcp')).toBe(true);
    expect(allows(rules, blocked, '10.9.0.7', 8050, 'tcp')).toBe(true);
    expect(allows(rules, blocked, '10.9.0.7', 81, 'tcp')).toBe(false);
    expect(allows(rules, blocked, '10.9.0.7', 80, 'udp')).toBe(false);
    expect(allows(rules, blocked, '10.9.1.7', 80, 'tcp')).toBe(false);
    expect(allows(rules, blocked, '169.254.169.254', 80, 'tcp')).toBe(false);
  });
  it('renders the sandbox ruleset as one replacing transaction, default drop, no IPv6', () => {
    const text = renderSandboxRuleset({ rules, blocked, hostAddress: '10.200.0.1' });
    expect(text.startsWith('table inet rollbox\ndelete table inet rollbox\n')).toBe(true);
    expect(text).toContain('type filter hook output priority 0; policy drop;');
    expect(text).toContain('meta nfproto ipv6 goto refuse');
    expect(text).toContain('elements = { 169.254.0.0-169.254.255.255 }');
    expect(text).toContain('ip daddr 10.9.0.0/24 meta l4proto tcp th dport { 80, 8000-8100 } accept');
    expect(text).toContain('ip saddr 10.9.0.0/24 meta l4proto tcp th sport { 80, 8000-8100 } ct state established accept');
    // The blocked check comes before any allow rule.
    expect(text.indexOf('ip daddr @blocked')).toBeLessThan(text.indexOf('ip daddr 10.9.0.0/24'));
    expect(text.indexOf('ip daddr @blocked')).toBeLessThan(text.indexOf('ip daddr 169.254.169.254/32 accept'));
  });
  it('renders the host chain with an anti-spoofing check and a final refusal', () => {
    const text = renderHostSandboxChain('rollbox-n1', 'rb0123456789abc', '10.200.0.2', rules);
    const lines = text.trim().split('\n');
    expect(lines).toContain('add rule inet rollbox-n1 eg_rb0123456789abc ip saddr != 10.200.0.2 drop');
    // The refusal ends the chain: every rule before it, then the veth joins the sets.
    expect(lines[lines.indexOf('add element inet rollbox-n1 veths { "rb0123456789abc" }') - 1]).toBe('add rule inet rollbox-n1 eg_rb0123456789abc goto refuse');
    // Not a gateway sandbox: its veth is taken out of gateway_veths (added first, so the delete cannot fail).
    expect(lines.at(-1)).toBe('delete element inet rollbox-n1 gateway_veths { "rb0123456789abc" }');
    const withGateway = renderHostSandboxChain('rollbox-n1', 'rb0123456789abc', '10.200.0.2', rules, true).trim().split('\n');
    expect(withGateway.at(-1)).toBe('add element inet rollbox-n1 gateway_veths { "rb0123456789abc" }');
  });
});

describe('dns responder', () => {
  const names = new Map([['allowed.name', ['10.9.0.7']]]);
  it('answers A for allowlisted names and NXDOMAIN for the rest', () => {
    const ok = answer(query('Allowed.Name'), names)!;
    expect(ok.readUInt16BE(0)).toBe(0x1234);
    expect(ok.readUInt16BE(2) & 0xf).toBe(0);
    expect(ok.readUInt16BE(6)).toBe(1);
    expect([...ok.subarray(ok.length - 4)]).toEqual([10, 9, 0, 7]);
    const nx = answer(query('c2VjcmV0.evil.example'), names)!;
    expect(nx.readUInt16BE(2) & 0xf).toBe(3);
    expect(nx.readUInt16BE(6)).toBe(0);
    expect(answer(query('allowed.name', 28), names)!.readUInt16BE(6)).toBe(0);
  });
  it('survives malformed packets', () => {
    expect(parseQuery(Buffer.from([1, 2, 3]))).toBeUndefined();
    expect(answer(Buffer.from([1]), names)).toBeUndefined();
    const truncated = query('allowed.name').subarray(0, 20);
    expect(answer(truncated, names)!.readUInt16BE(2) & 0xf).toBe(1);
  });
});

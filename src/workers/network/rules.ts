/**
 * Pure part of sandbox networking: IPv4 arithmetic, the always-blocked list, the address
 * pool layout, and the nftables rulesets rendered as text. No I/O here, so every rule the
 * kernel gets can be unit-tested (rules.test.ts).
 */

/** An allow entry after hostnames were resolved and ports parsed: IPv4 only. */
export interface ResolvedRule {
  /** `a.b.c.d/len`, normalized (host bits zero). */
  cidr: string;
  /** Inclusive port ranges; undefined: every port. */
  ports?: [number, number][];
  protocol: 'tcp' | 'udp' | 'any';
}

/**
 * Destinations no allowlist can open, IPv4 part (there is no IPv6 in a sandbox at all):
 * link-local (cloud metadata at 169.254.169.254), loopback and "this network" (they
 * reach the host), multicast, reserved and broadcast. The host's own addresses and the
 * veth pool (other sandboxes) are added per host.
 */
export const ALWAYS_BLOCKED_V4 = ['0.0.0.0/8', '127.0.0.0/8', '169.254.0.0/16', '224.0.0.0/4', '240.0.0.0/4'] as const;

export function parseIpv4(ip: string): number | undefined {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(ip);
  if (!m) return undefined;
  const octets = m.slice(1).map(Number);
  if (octets.some((o) => o > 255)) return undefined;
  return ((octets[0]! << 24) >>> 0) + (octets[1]! << 16) + (octets[2]! << 8) + octets[3]!;
}

export function formatIpv4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/** `a.b.c.d/len` or a bare address as an inclusive range; undefined for anything else (IPv6 included). */
export function ipv4Range(cidr: string): [number, number] | undefined {
  const [ip, lenText, extra] = cidr.split('/');
  if (extra !== undefined) return undefined;
  const base = parseIpv4(ip ?? '');
  const len = lenText === undefined ? 32 : /^\d{1,2}$/.test(lenText) ? Number(lenText) : NaN;
  if (base === undefined || !(len >= 0 && len <= 32)) return undefined;
  const size = 2 ** (32 - len);
  const start = base - (base % size);
  return [start, start + size - 1];
}

export function normalizeCidr(cidr: string): string | undefined {
  const range = ipv4Range(cidr);
  if (!range) return undefined;
  const len = 32 - Math.log2(range[1] - range[0] + 1);
  return `${formatIpv4(range[0])}/${len}`;
}

/** Sorted, merged ranges (nft refuses overlapping interval elements). */
export function mergeRanges(ranges: readonly [number, number][]): [number, number][] {
  const sorted = [...ranges].sort((a, b) => a[0] - b[0]);
  const out: [number, number][] = [];
  for (const [s, e] of sorted) {
    const last = out[out.length - 1];
    if (last && s <= last[1] + 1) last[1] = Math.max(last[1], e);
    else out.push([s, e]);
  }
  return out;
}

/** `80`, `8000-8100` -> [from, to]; undefined when malformed or out of order. */
export function parsePortSpec(spec: number | string): [number, number] | undefined {
  if (typeof spec === 'number') return Number.isInteger(spec) && spec >= 1 && spec <= 65_535 ? [spec, spec] : undefined;
  const m = /^(\d{1,5})-(\d{1,5})$/.exec(spec);
  if (!m) return undefined;
  const from = Number(m[1]);
  const to = Number(m[2]);
  return from >= 1 && to <= 65_535 && from <= to ? [from, to] : undefined;
}

/** One sandbox's slot in the host's veth pool: a /30 (network, host end, sandbox end, broadcast). */
export interface Slot {
  index: number;
  hostAddress: string;
  sandboxAddress: string;
}

export function poolSlots(poolCidr: string): number {
  const range = ipv4Range(poolCidr);
  if (!range) throw new Error(`invalid pool ${poolCidr}`);
  return Math.floor((range[1] - range[0] + 1) / 4);
}

export function slotOf(poolCidr: string, index: number): Slot {
  const range = ipv4Range(poolCidr)!;
  const base = range[0] + index * 4;
  return { index, hostAddress: formatIpv4(base + 1), sandboxAddress: formatIpv4(base + 2) };
}

/** Whether the allowlist lets `ip:port/protocol` through (same semantics as the rendered rules). */
export function allows(rules: readonly ResolvedRule[], blocked: readonly [number, number][], ip: string, port: number, protocol: 'tcp' | 'udp'): boolean {
  const n = parseIpv4(ip);
  if (n === undefined) return false;
  if (blocked.some(([s, e]) => n >= s && n <= e)) return false;
  return rules.some((r) => {
    const [s, e] = ipv4Range(r.cidr)!;
    if (n < s || n > e) return false;
    if (r.protocol !== 'any' && r.protocol !== protocol) return false;
    return !r.ports || r.ports.some(([from, to]) => port >= from && port <= to);
  });
}

function rangeElements(ranges: readonly [number, number][]): string {
  return ranges.map(([s, e]) => (s === e ? formatIpv4(s) : `${formatIpv4(s)}-${formatIpv4(e)}`)).join(', ');
}

function portsExpr(ports: [number, number][]): string {
  return `{ ${ports.map(([f, t]) => (f === t ? String(f) : `${f}-${t}`)).join(', ')} }`;
}

/**
 * The match part of one allow rule, from the sandbox's point of view: `out` for packets it
 * sends (destination side), `in` for what comes back (source side).
 */
function ruleMatch(rule: ResolvedRule, direction: 'out' | 'in'): string {
  const addr = direction === 'out' ? 'daddr' : 'saddr';
  const port = direction === 'out' ? 'dport' : 'sport';
  const proto = rule.protocol === 'any' ? (rule.ports ? 'meta l4proto { tcp, udp }' : '') : `meta l4proto ${rule.protocol}`;
  const ports = rule.ports ? `th ${port} ${portsExpr(rule.ports)}` : '';
  return [`ip ${addr} ${rule.cidr}`, proto, ports].filter(Boolean).join(' ');
}

export interface SandboxRulesInput {
  rules: readonly ResolvedRule[];
  /** Merged always-blocked ranges (fixed list + host addresses + pool). */
  blocked: readonly [number, number][];
  /** The host end of the veth: the sandbox's gateway and DNS resolver. */
  hostAddress: string;
  /** The port on the host end that the host's kernel forwards to a rollbox gateway (`gateway: true`), else none. */
  gatewayPort?: number;
}

/**
 * The ruleset inside the sandbox's network namespace, as one `nft -f` transaction that
 * replaces the whole table (atomic: no moment with no rules). Every packet is checked in
 * both directions, not only new connections, so a narrowed allowlist stops flows that are
 * already open; TCP gets a reset so the sandbox's socket fails at once instead of hanging.
 * No IPv6 at all except loopback.
 */
export function renderSandboxRuleset(input: SandboxRulesInput): string {
  const gw = input.hostAddress;
  const lines = [
    'table inet rollbox',
    'delete table inet rollbox',
    'table inet rollbox {',
    '  set blocked {',
    '    type ipv4_addr; flags interval;',
    `    elements = { ${rangeElements(input.blocked)} }`,
    '  }',
    '  chain refuse {',
    '    meta l4proto tcp reject with tcp reset',
    '    reject with icmpx type admin-prohibited',
    '  }',
    '  chain output {',
    '    type filter hook output priority 0; policy drop;',
    '    oif "lo" accept',
    '    meta nfproto ipv6 goto refuse',
    // DNS only to the platform's resolver on the host end of the veth.
    `    ip daddr ${gw} udp dport 53 accept`,
    ...(input.gatewayPort ? [`    ip daddr ${gw} tcp dport ${input.gatewayPort} accept`] : []),
    '    ip daddr @blocked goto refuse',
    ...input.rules.map((r) => `    ${ruleMatch(r, 'out')} accept`),
    '    goto refuse',
    '  }',
    '  chain input {',
    '    type filter hook input priority 0; policy drop;',
    '    iif "lo" accept',
    // ICMP errors about the sandbox's own flows (a refusal, "port unreachable") end them fast.
    '    meta l4proto icmp ct state related accept',
    `    ip saddr ${gw} udp sport 53 ct state established accept`,
    ...(input.gatewayPort ? [`    ip saddr ${gw} tcp sport ${input.gatewayPort} ct state established accept`] : []),
    '    ip saddr @blocked drop',
    ...input.rules.map((r) => `    ${ruleMatch(r, 'in')} ct state established accept`),
    '  }',
    '  chain forward {',
    '    type filter hook forward priority 0; policy drop;',
    '  }',
    '}',
  ];
  return `${lines.join('\n')}\n`;
}

export interface HostBaseInput {
  table: string;
  poolCidr: string;
  blocked: readonly [number, number][];
  /** The port on each veth's host end that reaches the gateway (see renderGatewayDnat), open to the veths in `gateway_veths`. */
  gatewayPort: number;
}

/**
 * The worker's own table on the host (`inet rollbox-<nodeId>`; several workers may share a
 * machine): sandbox traffic leaving its veth is dispatched by interface name to that
 * sandbox's egress chain (see renderHostSandboxChain); nothing from a rollbox veth
 * reaches the host itself except DNS to the platform resolver and, from agent sandboxes,
 * the gateway; replies come back only on established flows; NAT to the outside.
 * Idempotent: re-running it leaves the per-sandbox chains and map elements alone.
 */
export function renderHostBase(input: HostBaseInput): string {
  const t = `inet ${input.table}`;
  const toGateway = gatewayFlow(input.poolCidr, input.gatewayPort);
  return [
    `add table ${t}`,
    `add set ${t} veths { type ifname; }`,
    `add set ${t} gateway_veths { type ifname; }`,
    `add map ${t} egress { type ifname : verdict; }`,
    `add set ${t} blocked { type ipv4_addr; flags interval; }`,
    `flush set ${t} blocked`,
    `add element ${t} blocked { ${rangeElements(input.blocked)} }`,
    `add chain ${t} refuse`,
    `flush chain ${t} refuse`,
    `add rule ${t} refuse meta l4proto tcp reject with tcp reset`,
    `add rule ${t} refuse reject with icmpx type admin-prohibited`,
    `add chain ${t} forward { type filter hook forward priority 0; policy accept; }`,
    `flush chain ${t} forward`,
    // An agent sandbox's connection to the gateway, sent by gateway_dnat to a gateway on another machine.
    `add rule ${t} forward iifname @gateway_veths ${toGateway} accept`,
    `add rule ${t} forward iifname vmap @egress`,
    // A veth of ours with no chain (being set up or torn down): nothing passes.
    `add rule ${t} forward iifname @veths drop`,
    `add rule ${t} forward oifname @veths ct state established,related accept`,
    `add rule ${t} forward oifname @veths drop`,
    `add chain ${t} input { type filter hook input priority 0; policy accept; }`,
    `flush chain ${t} input`,
    `add rule ${t} input iifname @veths ip daddr ${input.poolCidr} udp dport 53 accept`,
    // The same connection to a gateway on this machine (loopback included: the veth has route_localnet).
    // Matched by where the sandbox sent it, so nothing else of the host opens: a packet the
    // sandbox sends to 127.0.0.1 itself is dropped below.
    `add rule ${t} input iifname @gateway_veths ${toGateway} accept`,
    `add rule ${t} input iifname @veths drop`,
    // Its rule is gateway_dnat's alone (renderGatewayDnat): not flushed here, so a restarted
    // worker's base leaves its agent sandboxes' reach to the gateway as it was.
    `add chain ${t} gateway_dnat { type nat hook prerouting priority dstnat; policy accept; }`,
    `add chain ${t} postrouting { type nat hook postrouting priority srcnat; policy accept; }`,
    `flush chain ${t} postrouting`,
    `add rule ${t} postrouting ip saddr ${input.poolCidr} oifname != @veths masquerade`,
    '',
  ].join('\n');
}

export function egressChainOf(veth: string): string {
  return `eg_${veth}`;
}

/**
 * One sandbox's egress chain on the host's forward path (defence in depth: it holds even
 * if the sandbox's own ruleset were gone, and against packets crafted with CAP_NET_RAW),
 * replaced in one transaction.
 */
export function renderHostSandboxChain(table: string, veth: string, sandboxAddress: string, rules: readonly ResolvedRule[], gateway = false): string {
  const t = `inet ${table}`;
  const chain = egressChainOf(veth);
  return [
    `add chain ${t} ${chain}`,
    `flush chain ${t} ${chain}`,
    `add rule ${t} ${chain} meta nfproto ipv6 drop`,
    // Only the sandbox's own address: a spoofed source could pose as another sandbox.
    `add rule ${t} ${chain} ip saddr != ${sandboxAddress} drop`,
    `add rule ${t} ${chain} ip daddr @blocked goto refuse`,
    ...rules.map((r) => `add rule ${t} ${chain} ${ruleMatch(r, 'out')} accept`),
    `add rule ${t} ${chain} goto refuse`,
    `add element ${t} veths { "${veth}" }`,
    `add element ${t} egress { "${veth}" : jump ${chain} }`,
    // Added, then removed unless it reaches the gateway: a delete of a missing element would fail the transaction.
    `add element ${t} gateway_veths { "${veth}" }`,
    ...(gateway ? [] : [`delete element ${t} gateway_veths { "${veth}" }`]),
    '',
  ].join('\n');
}

export function renderHostSandboxRemoval(table: string, veth: string): string {
  const t = `inet ${table}`;
  return [`delete element ${t} egress { "${veth}" }`, `delete element ${t} veths { "${veth}" }`, `add element ${t} gateway_veths { "${veth}" }`, `delete element ${t} gateway_veths { "${veth}" }`, `delete chain ${t} ${egressChainOf(veth)}`, ''].join('\n');
}

/** Packets of a connection a sandbox opened to a veth host end's gateway port, before and after gateway_dnat. */
function gatewayFlow(poolCidr: string, gatewayPort: number): string {
  return `meta l4proto tcp ct original ip daddr ${poolCidr} ct original proto-dst ${gatewayPort}`;
}

/**
 * Where agent sandboxes' `gateway.rollbox.internal:9180` goes: one DNAT rule, replaced whole
 * when the worker's probe finds the gateway it named gone. The kernel holds it, so agents
 * reach the gateway while their worker host is down (killed, restarting, upgraded); only a
 * change of gateway waits for the worker. With no target, connections are refused (nothing
 * listens on the host end) and the agents' SDKs retry.
 */
export function renderGatewayDnat(table: string, poolCidr: string, gatewayPort: number, target?: { address: string; port: number }): string {
  const t = `inet ${table}`;
  return [
    `flush chain ${t} gateway_dnat`,
    ...(target ? [`add rule ${t} gateway_dnat iifname @gateway_veths ip daddr ${poolCidr} tcp dport ${gatewayPort} dnat ip to ${target.address}:${target.port}`] : []),
    '',
  ].join('\n');
}

import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import net from 'node:net';

/**
 * Another "host" for tests that must change a host's firewall: a network namespace of the
 * test's own, with the rule sets of a real operator's machine, so nothing outside it is
 * touched (netfilter tables, both iptables backends and `ip_forward` are per namespace).
 * A worker started inside it reaches the test's Redis through a TCP relay on a veth.
 */
export type FirewallFixture = 'docker-iptables-nft' | 'docker-iptables-legacy' | 'nftables-host-firewall' | 'prerouting-drop';

export interface NetnsHost {
  name: string;
  /** Redis as the worker inside sees it (through the relay). */
  redisUrl: string;
  /** Every rule set of the namespace, normalized (no counters, no timestamps). */
  rulesets(): string;
  /** The addresses the host has (its own: no sandbox may reach them). */
  addresses: string[];
  /** Empties the chain where rollbox's rules sit and puts back the owner's own, as a dockerd or firewall restart does. */
  flushFirewall(): void;
  ipForward(): string;
  setIpForward(value: '0' | '1'): void;
  stop(): Promise<void>;
}

/** Docker's filter and nat rules as dockerd 2x writes them for its default bridge. */
const DOCKER_RULES = `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER - [0:0]
:DOCKER-ISOLATION-STAGE-1 - [0:0]
:DOCKER-ISOLATION-STAGE-2 - [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -o docker0 -j DOCKER
-A FORWARD -i docker0 ! -o docker0 -j ACCEPT
-A FORWARD -i docker0 -o docker0 -j ACCEPT
-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
-A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
-A DOCKER-ISOLATION-STAGE-2 -j RETURN
-A DOCKER-USER -j RETURN
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A DOCKER -i docker0 -j RETURN
COMMIT
`;

/** A host firewall in native nftables (firewalld's or ufw's shape): drop by default on input, forward and output. */
const hostFirewall = (relayAddress: string) => `table inet hostfw {
  chain filter_in { type filter hook input priority filter; policy drop; iif "lo" accept; ct state established,related accept; }
  chain filter_fw { type filter hook forward priority filter + 10; policy drop; ct state invalid drop; }
  chain filter_out { type filter hook output priority filter; policy drop; oif "lo" accept; ct state established,related accept; ip daddr ${relayAddress} accept; }
}
`;

/** What no rollbox rule can open: a drop at prerouting, a hook rollbox does not touch. */
const PREROUTING_DROP = `table ip edge {
  chain early { type filter hook prerouting priority raw; iifname "rb*" drop; }
}
`;

export async function startNetnsHost(options: { subnet: number; redisPort: number; fixture: FirewallFixture }): Promise<NetnsHost> {
  const tag = randomBytes(3).toString('hex');
  const name = `rbhost-${tag}`;
  const outerVeth = `rbh${tag}o`;
  const relayAddress = `10.252.${options.subnet}.1`;
  const inNs = (file: string, args: string[], input?: string) => execFileSync('nsenter', [`--net=/run/netns/${name}`, '--', file, ...args], { encoding: 'utf8', input });
  let relay: net.Server | undefined;
  const sockets = new Set<net.Socket>();
  const stop = async () => {
    for (const s of sockets) s.destroy();
    if (relay) await new Promise((r) => relay!.close(r));
    quiet('ip', ['link', 'del', outerVeth]);
    quiet('ip', ['netns', 'del', name]);
  };
  try {
    execFileSync('ip', ['netns', 'add', name]);
    execFileSync('ip', ['link', 'add', outerVeth, 'type', 'veth', 'peer', 'name', 'uplink', 'netns', name]);
    execFileSync('ip', ['addr', 'add', `${relayAddress}/30`, 'dev', outerVeth]);
    execFileSync('ip', ['link', 'set', outerVeth, 'up']);
    execFileSync('ip', ['-n', name, '-batch', '-'], { input: `link set lo up\naddr add 10.252.${options.subnet}.2/30 dev uplink\nlink set uplink up\n` });
    // The relay: what the worker inside sends to relayAddress:port reaches the test's Redis on loopback.
    relay = net.createServer((inbound) => {
      const outbound = net.connect(options.redisPort, '127.0.0.1');
      for (const s of [inbound, outbound]) {
        sockets.add(s);
        s.on('error', () => s.destroy());
        s.on('close', () => sockets.delete(s));
      }
      inbound.pipe(outbound).pipe(inbound);
    });
    await new Promise<void>((r) => relay!.listen(0, relayAddress, () => r()));
    if (options.fixture === 'docker-iptables-nft') inNs('iptables-nft-restore', [], DOCKER_RULES);
    if (options.fixture === 'docker-iptables-legacy') inNs('iptables-legacy-restore', [], DOCKER_RULES);
    if (options.fixture === 'nftables-host-firewall') inNs('nft', ['-f', '-'], hostFirewall(relayAddress));
    if (options.fixture === 'prerouting-drop') inNs('nft', ['-f', '-'], PREROUTING_DROP);
  } catch (err) {
    await stop();
    throw err;
  }
  const port = (relay.address() as net.AddressInfo).port;
  return {
    name,
    redisUrl: `redis://${relayAddress}:${port}`,
    rulesets: () =>
      [inNs('nft', ['-s', 'list', 'ruleset']), inNs('iptables-nft-save', []), inNs('iptables-legacy-save', [])]
        .join('\n')
        .split('\n')
        .filter((l) => !l.startsWith('#'))
        .map((l) => l.replace(/\[\d+:\d+\]/g, ''))
        .join('\n'),
    addresses: [`10.252.${options.subnet}.2`],
    flushFirewall: () => {
      const iptables = options.fixture === 'docker-iptables-nft' ? 'iptables-nft' : 'iptables-legacy';
      // A firewall reload: its table replaced by its own rules.
      if (options.fixture === 'nftables-host-firewall') inNs('nft', ['-f', '-'], `delete table inet hostfw\n${hostFirewall(relayAddress)}`);
      else inNs('sh', ['-c', `${iptables} -F DOCKER-USER && ${iptables} -A DOCKER-USER -j RETURN`]);
    },
    ipForward: () => inNs('cat', ['/proc/sys/net/ipv4/ip_forward']).trim(),
    setIpForward: (value) => void inNs('sh', ['-c', `echo ${value} > /proc/sys/net/ipv4/ip_forward`]),
    stop,
  };
}

function quiet(file: string, args: string[]): void {
  try {
    execFileSync(file, args, { stdio: 'ignore' });
  } catch {
    // already gone
  }
}

// Longer than most: one host's sandbox networks (attach, stage changes, the gateway's reach,
// release, reconcile after a restart) share the leases and the nftables table they keep.
import { createHash } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { RollboxError, SANDBOX_GATEWAY, hasNetwork, type NetworkPolicy } from '../../api/index.ts';
import { runTool, runToolOk } from '../../proc/index.ts';
import { DnsResponder } from './dns.ts';
import { GatewayReach, type HostPort } from './gateway-reach.ts';
import { HostFirewall, type NetworkLogger } from './host-firewall.ts';
import { AddressLeases } from './leases.ts';
import { blockedRanges, resolvePolicy } from './resolve.ts';
import {
  allows,
  ipv4Range,
  normalizeCidr,
  poolSlots,
  renderGatewayDnat,
  renderHostBase,
  renderHostSandboxChain,
  renderHostSandboxRemoval,
  renderSandboxRuleset,
  slotOf,
  type ResolvedRule,
  type Slot,
} from './rules.ts';

export interface SandboxNetworksDeps {
  nodeId: string;
  /** Veth addresses, one /30 per sandbox (default 10.200.0.0/16). Shared by every worker on the host. */
  poolCidr?: string;
  /** Host-wide directory of address leases (one file per /30), shared by the workers of this host. */
  leaseDir?: string;
  /** More destinations to block whatever the policy says (e.g. Redis when it runs on another machine). */
  blockedCidrs?: readonly string[];
  /** Resolves an allowlisted hostname to IPv4 addresses (the platform's resolver). */
  resolveHost: (name: string) => Promise<string[]>;
  /** Where a sandbox with `gateway: true` reaches the gateway: the gateways as this host reaches them (asked at each probe), the first that answers in this host's order (gateway-reach.ts). */
  gatewayTargets?: () => HostPort[];
  logger?: NetworkLogger;
}

interface Attached {
  slot: Slot;
  veth: string;
  /** The sandbox's network namespace (`/proc/<init pid>/ns/net`). */
  netns: string;
  dns: DnsResponder;
  /** Whether it reaches the gateway (`gateway: true`): its veth is in gateway_veths. */
  gateway?: boolean;
  /** A microVM's network: the sandbox end is a port of this bridge in the namespace (see ApplyOptions). */
  bridge?: string;
}

export interface ApplyOptions {
  /** The self-test's own probe: applied even while the self-test fails. */
  probe?: boolean;
  /**
   * A microVM's namespace: the veth's sandbox end becomes a port of this bridge (which
   * holds the VM's tap) instead of taking the address itself; the guest holds the
   * address, with the same gateway and resolver a container gets. Such sandboxes are the
   * microVM runtime's: `reconcile` (the container runtime's) leaves them alone.
   */
  bridge?: string;
}

/** A sandbox's network namespace: its init's pid, or a namespace path (the self-test's probe). */
export type NetnsRef = number | string;
const netnsPath = (ref: NetnsRef) => (typeof ref === 'number' ? `/proc/${ref}/ns/net` : ref);

/** nft listings grow with the sandboxes on the host: keep all of it. */
const NFT_OUTPUT_CAP_BYTES = 16 * 1024 * 1024;
const run = (file: string, args: readonly string[], input?: string) => runTool(file, args, { input, capBytes: NFT_OUTPUT_CAP_BYTES });
const must = async (file: string, args: readonly string[], input?: string) => (await runToolOk(file, args, { input, capBytes: NFT_OUTPUT_CAP_BYTES })).stdout;

/** The host end of a sandbox's veth: `rb` + 13 hex of its id's hash (interface names stop at 15 chars). */
export function vethOf(sandboxId: string): string {
  return `rb${createHash('sha256').update(sandboxId).digest('hex').slice(0, 13)}`;
}

/**
 * Network policy of the sandboxes of one worker host. `mode: none` is runc's own empty
 * network namespace (loopback only) and needs nothing here. `mode: allowlist` adds to that
 * namespace (the container's, entered through its init pid) a veth to the host with a /30
 * from the pool, a default route, and nftables rules inside it; on the host, a chain on
 * the forward path that repeats the allowlist, NAT, and a DNS responder on the veth's host
 * end. Policy changes replace both rulesets atomically and cut open connections the new
 * policy no longer allows.
 *
 * Everything is found again from kernel state and lease files, so a restarted worker
 * adopts or removes what an earlier one left: the veth disappears with the container's
 * namespace, the lease and host chain are removed by `release`/`reconcile`.
 */
export class SandboxNetworks {
  private readonly attached = new Map<string, Attached>();
  readonly poolCidr: string;
  readonly leaseDir: string;
  private readonly table: string;
  /** The host table and the firewall's rules in place (made once; again after a reconcile removed them): where they sit. */
  private baseReady: Promise<string[]> | undefined;
  /** Whether this process began to set the host up (forwarding, table, rules): its reconcile then removes all of it. */
  private hostTouched = false;
  /** Which gateway this host's agent sandboxes reach (the DNAT rule and its probe). */
  private readonly reach: GatewayReach;
  private readonly leases: AddressLeases;
  private readonly firewall: HostFirewall;
  private readonly log: NetworkLogger | undefined;
  /**
   * The last self-test's verdict. While it says the forward path does not work, no
   * sandbox gets an allowlist network here (a network that silently does nothing is worse
   * than a clear refusal); sandboxes are placed on hosts where it works.
   */
  failing: string | undefined;

  constructor(private readonly deps: SandboxNetworksDeps) {
    this.poolCidr = normalizeCidr(deps.poolCidr ?? '10.200.0.0/16') ?? '';
    if (!this.poolCidr || poolSlots(this.poolCidr) < 1) throw new RollboxError('invalid_request', `invalid veth pool ${deps.poolCidr}`);
    for (const c of deps.blockedCidrs ?? []) if (!ipv4Range(c)) throw new RollboxError('invalid_request', `invalid blocked CIDR ${c}`);
    this.leaseDir = deps.leaseDir ?? '/run/rollbox/net';
    this.table = `rollbox-${deps.nodeId}`;
    this.log = deps.logger;
    this.leases = new AddressLeases(this.leaseDir, deps.nodeId);
    this.firewall = new HostFirewall({ nodeId: deps.nodeId, poolCidr: this.poolCidr, stateDir: this.leaseDir, log: deps.logger });
    this.reach = new GatewayReach({
      nodeId: deps.nodeId,
      targets: () => deps.gatewayTargets?.() ?? [],
      inUse: () => [...this.attached.values()].some((n) => n.gateway),
      point: (target) => this.nft(renderGatewayDnat(this.table, this.poolCidr, SANDBOX_GATEWAY.port, target)),
      resetConnections: (which) => this.resetConnectionsToGateway(which),
      ...(deps.logger ? { log: deps.logger } : {}),
    });
  }

  /** The host address a sandbox's DNS queries go to (its resolv.conf), when it has a network. */
  resolverOf(sandboxId: string): string | undefined {
    return this.attached.get(sandboxId)?.slot.hostAddress;
  }

  /**
   * Make the sandbox's network match `policy` (create, stage change, adoption, wake).
   * `netns` is the container's init (its network namespace). Idempotent. Refused while
   * the self-test fails, except for the self-test's own probe.
   */
  async apply(sandboxId: string, netns: NetnsRef, policy: NetworkPolicy, options: ApplyOptions = {}): Promise<void> {
    const ns = netnsPath(netns);
    if (!hasNetwork(policy)) {
      if (this.attached.has(sandboxId)) await this.detach(sandboxId, ns);
      return;
    }
    if (this.failing && !options.probe) throw new RollboxError('network_unavailable', `sandbox networking does not work on this worker host: ${this.failing}`, 30);
    const gateway = policy.gateway === true;
    if (gateway && (!this.deps.gatewayTargets?.().length || options.bridge)) {
      throw new RollboxError('network_unavailable', options.bridge ? 'network.gateway is not available to microVM sandboxes yet' : 'this worker host does not know the gateway (ROLLBOX_SANDBOX_GATEWAY_URL)', 30);
    }
    const { rules, names } = await resolvePolicy(policy, this.deps.resolveHost);
    const blocked = await blockedRanges(this.deps.blockedCidrs ?? [], this.poolCidr);
    let net = this.attached.get(sandboxId);
    if (!net) {
      net = await this.attach(sandboxId, ns, rules, blocked, gateway, options.bridge);
    } else {
      await this.nft(renderHostSandboxChain(this.table, net.veth, net.slot.sandboxAddress, rules, gateway));
      // The new ruleset, then (same process) the connections open now, to reset the forbidden ones.
      const open = await must('nsenter', [`--net=${ns}`, '--', 'sh', '-c', 'nft -f - && ss -tnH state established'], renderSandboxRuleset({ rules, blocked, hostAddress: net.slot.hostAddress, ...(gateway ? { gatewayPort: SANDBOX_GATEWAY.port } : {}) }));
      await this.cutDisallowedFlows(ns, open, (ip, port) => allows(rules, blocked, ip, port, 'tcp') || (gateway && ip === net!.slot.hostAddress && port === SANDBOX_GATEWAY.port));
    }
    await this.setGatewayReach(net, gateway);
    net.dns.names = gateway ? new Map([...names, [SANDBOX_GATEWAY.host, [net.slot.hostAddress]]]) : names;
  }

  /** Where this host's agent sandboxes reach the gateway, while it has any (its heartbeat's `network.gateway`). */
  gatewayReach(): ReturnType<GatewayReach['status']> {
    return this.reach.status();
  }

  /** The names the sandbox may resolve, with the addresses its rules let through (empty without a network). */
  namesOf(sandboxId: string): ReadonlyMap<string, readonly string[]> {
    return this.attached.get(sandboxId)?.dns.names ?? new Map();
  }

  /**
   * The sandbox's reach to the gateway (`gateway: true`), on or off. Its veth takes packets
   * to loopback (route_localnet: a gateway on 127.0.0.1 is reached through the DNAT rule; the
   * host's input chain still drops anything else), and the probe keeps the DNAT rule on a
   * live gateway while any agent sandbox is here.
   */
  private async setGatewayReach(net: Attached, gateway: boolean): Promise<void> {
    if ((net.gateway ?? false) !== gateway) await writeFile(`/proc/sys/net/ipv4/conf/${net.veth}/route_localnet`, gateway ? '1' : '0');
    net.gateway = gateway;
    if (gateway) await this.reach.ensure();
  }

  /**
   * After the DNAT rule moved: a connection already tracked keeps the old gateway (its
   * conntrack entry), and when that gateway's machine is gone its packets go unanswered for
   * minutes. Reset, the agent's client fails at once and its retry takes the new rule:
   * connections still being opened (`opening`), or every one (`all`, the old gateway stopped
   * answering, so the calls open on it wait for nothing).
   */
  private async resetConnectionsToGateway(which: 'opening' | 'all'): Promise<void> {
    for (const net of this.attached.values()) {
      if (!net.gateway) continue;
      const reset = await run('nsenter', [`--net=${net.netns}`, '--', 'ss', '-K', '-tnH', 'state', which === 'all' ? 'connected' : 'syn-sent', 'dst', net.slot.hostAddress, 'dport', '=', `:${SANDBOX_GATEWAY.port}`]);
      if (reset.code !== 0) this.log?.warn({ veth: net.veth, stderr: reset.stderr.trim() }, 'could not reset connections to the old gateway');
    }
  }

  /**
   * The host side in place and checked again (the self-test, every few seconds: Docker or
   * firewalld may have flushed rollbox's rules since): where they sit, and where they were put back.
   */
  async prepareHost(): Promise<{ placed: string[]; added: string[] }> {
    // A base this call makes has just placed the firewall's rules: not listed again at once
    // (nothing was lost in between, so nothing was put back).
    if (!this.baseReady) return { placed: await this.ensureBase(), added: [] };
    await this.ensureBase();
    await this.firewall.enableForwarding();
    return this.firewall.ensure();
  }

  /** What stands in sandbox traffic's way on this host, for a failed self-test. */
  diagnoseHost(): Promise<string> {
    return this.firewall.diagnose();
  }

  /** The sandbox's addresses (its own and its gateway's, the resolver), when it has a network. */
  addressOf(sandboxId: string): { sandboxAddress: string; hostAddress: string } | undefined {
    const slot = this.attached.get(sandboxId)?.slot;
    return slot && { sandboxAddress: slot.sandboxAddress, hostAddress: slot.hostAddress };
  }

  private async attach(sandboxId: string, netns: string, rules: ResolvedRule[], blocked: [number, number][], gateway: boolean, bridge?: string): Promise<Attached> {
    await this.ensureBase();
    const slot = await this.claimSlot(sandboxId);
    const veth = vethOf(sandboxId);
    try {
      // Host chain first, then the sandbox's own rules, then the veth: no packet can pass
      // before both rulesets are in place.
      await this.nft(renderHostSandboxChain(this.table, veth, slot.sandboxAddress, rules, gateway));
      const ruleset = renderSandboxRuleset({ rules, blocked, hostAddress: slot.hostAddress, ...(gateway ? { gatewayPort: SANDBOX_GATEWAY.port } : {}) });
      // One shell in the sandbox's network namespace (host binaries: only the network
      // namespace is entered); the ruleset comes on stdin, the link setup as one ip batch.
      const script = [
        'set -e',
        // No IPv6 on interfaces created from here on (eth0); loopback keeps ::1.
        'echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6',
        'nft -f -',
        `ip -batch - <<'EOF'`,
        // The peer is created in the worker's own network namespace (the host's).
        `link add eth0 type veth peer name ${veth} netns ${process.pid}`,
        ...(bridge
          ? [`link set eth0 master ${bridge}`, 'link set eth0 up']
          : [`addr add ${slot.sandboxAddress}/30 dev eth0`, 'link set eth0 up', `route add default via ${slot.hostAddress} dev eth0 onlink`]),
        'EOF',
      ].join('\n');
      await must('nsenter', [`--net=${netns}`, '--', 'sh', '-c', script], ruleset);
      await writeFile(`/proc/sys/net/ipv6/conf/${veth}/disable_ipv6`, '1').catch(() => undefined);
      await must('ip', ['-batch', '-'], `addr add ${slot.hostAddress}/30 dev ${veth}\nlink set ${veth} up\n`);
      const dns = await DnsResponder.start(slot.hostAddress, slot.sandboxAddress, (err) => this.log?.warn({ sandboxId, err: String(err) }, 'dns responder error'));
      const net: Attached = { slot, veth, netns, dns, ...(bridge ? { bridge } : {}) };
      this.attached.set(sandboxId, net);
      return net;
    } catch (err) {
      await this.removeHostSide(sandboxId, veth, slot.index);
      throw err;
    }
  }

  /** allowlist -> none while the sandbox runs: its veth, rules and open connections go. */
  private async detach(sandboxId: string, netns: string): Promise<void> {
    await this.release(sandboxId);
    const open = await run('nsenter', [`--net=${netns}`, '--', 'sh', '-c', 'nft delete table inet rollbox; ss -tnH state established']);
    await this.cutDisallowedFlows(netns, open.stdout, () => false);
  }

  /** Everything of the sandbox on the host side (its namespace dies with the container). Idempotent. */
  async release(sandboxId: string): Promise<void> {
    const net = this.attached.get(sandboxId);
    this.attached.delete(sandboxId);
    net?.dns.close();
    const index = (await this.leases.all()).get(sandboxId);
    // No lease: the sandbox never had a network here (mode none), nothing to remove.
    if (index === undefined) return;
    await this.removeHostSide(sandboxId, vethOf(sandboxId), index);
  }

  private async removeHostSide(sandboxId: string, veth: string, leaseIndex: number | undefined): Promise<void> {
    // The veth first (its peer in the sandbox goes with it), then the chain that guarded it.
    const del = await run('ip', ['link', 'del', veth]);
    if (del.code !== 0 && !/Cannot find device|does not exist/.test(del.stderr)) this.log?.warn({ sandboxId, stderr: del.stderr.trim() }, 'veth removal failed');
    if (this.baseReady || (await this.tableExists())) {
      const r = await run('nft', ['-f', '-'], renderHostSandboxRemoval(this.table, veth));
      if (r.code !== 0 && !/No such file|does not exist/.test(r.stderr)) {
        // Part of it may be gone already: remove what is left piece by piece.
        for (const line of renderHostSandboxRemoval(this.table, veth).split('\n').filter(Boolean)) await run('nft', line.split(' '));
      }
    }
    if (leaseIndex !== undefined) await this.leases.release(sandboxId, leaseIndex);
  }

  /**
   * Worker start or stop: `live` maps the sandboxes still running here to their init pid
   * and stored policy; they are adopted (rules re-applied, DNS responder back). Leases and
   * host chains of this worker that belong to no live sandbox are removed; with none left,
   * the worker's host table goes too, with its rules in other rule sets, and `ip_forward`
   * is put back as rollbox found it: the host is as before the worker started.
   */
  async reconcile(live: ReadonlyMap<string, { pid: number; policy: NetworkPolicy }>): Promise<{ removed: string[] }> {
    const removed: string[] = [];
    const leases = await this.leases.all();
    const hadLeases = leases.size > 0;
    for (const sandboxId of [...leases.keys()]) {
      const policy = live.get(sandboxId)?.policy;
      if ((policy && hasNetwork(policy)) || this.attached.get(sandboxId)?.bridge) continue;
      await this.release(sandboxId);
      removed.push(sandboxId);
    }
    for (const [id, { pid, policy }] of live) {
      const index = leases.get(id);
      if (!hasNetwork(policy) || this.attached.has(id) || index === undefined) continue;
      await this.adoptLeased(id, index, pid, policy);
    }
    // Host chains whose lease is gone (a crash between the two).
    const keepVeths = new Set([...this.attached.keys()].map(vethOf));
    const hadTable = await this.tableExists();
    if (hadTable) {
      const listed = await run('nft', ['-j', 'list', 'map', 'inet', this.table, 'egress']);
      const elems = listed.stdout.match(/"rb[0-9a-f]{13}"/g) ?? [];
      for (const quoted of elems) {
        const veth = quoted.slice(1, -1);
        if (!keepVeths.has(veth)) await this.removeHostSide(veth, veth, undefined);
      }
      if (this.attached.size === 0) {
        await run('nft', ['delete', 'table', 'inet', this.table]);
        this.baseReady = undefined;
        this.reach.forget();
      }
    }
    // A worker that has no table or lease here and has not set the host up yet (a new node's
    // first start) does not list the host's rule sets for rules of its own: the self-test
    // that follows checks them, and a later reconcile (the stop) removes them.
    if (this.attached.size === 0 && (hadTable || hadLeases || this.hostTouched)) {
      await this.firewall.remove();
      await this.firewall.restoreForwarding();
    }
    return { removed };
  }

  /**
   * A microVM's network after a worker restart (its runtime's reconcile): rules and DNS
   * responder back on its lease. False when it has no lease here (it never had a network).
   */
  async adopt(sandboxId: string, netns: NetnsRef, policy: NetworkPolicy, options: ApplyOptions = {}): Promise<boolean> {
    if (this.attached.has(sandboxId)) return true;
    const index = (await this.leases.all()).get(sandboxId);
    if (!hasNetwork(policy) || index === undefined) return false;
    await this.adoptLeased(sandboxId, index, netns, policy, options.bridge);
    return true;
  }

  private async adoptLeased(sandboxId: string, index: number, netns: NetnsRef, policy: NetworkPolicy, bridge?: string): Promise<void> {
    await this.ensureBase();
    const slot = slotOf(this.poolCidr, index);
    const dns = await DnsResponder.start(slot.hostAddress, slot.sandboxAddress, (err) => this.log?.warn({ sandboxId, err: String(err) }, 'dns responder error'));
    this.attached.set(sandboxId, { slot, veth: vethOf(sandboxId), netns: netnsPath(netns), dns, ...(bridge ? { bridge } : {}) });
    await this.apply(sandboxId, netns, policy);
  }

  private async tableExists(): Promise<boolean> {
    return (await run('nft', ['list', 'table', 'inet', this.table])).code === 0;
  }

  private async nft(script: string): Promise<void> {
    await must('nft', ['-f', '-'], script);
  }

  private ensureBase(): Promise<string[]> {
    this.baseReady ??= (async () => {
      this.hostTouched = true;
      // Forwarding is needed for any sandbox traffic to leave the host; what may be
      // forwarded from a sandbox is decided by the chains below.
      await this.firewall.enableForwarding();
      await this.nft(renderHostBase({ table: this.table, poolCidr: this.poolCidr, blocked: await blockedRanges(this.deps.blockedCidrs ?? [], this.poolCidr), gatewayPort: SANDBOX_GATEWAY.port }));
      return (await this.firewall.ensure()).placed;
    })().catch((err: unknown) => {
      this.baseReady = undefined;
      throw err;
    });
    return this.baseReady;
  }

  /** Reset the sandbox's open TCP connections (`ss -tnH state established` output) whose peer the policy no longer allows. */
  private async cutDisallowedFlows(netns: string, established: string, allowed: (ip: string, port: number) => boolean): Promise<void> {
    const filters: string[][] = [];
    for (const line of established.split('\n')) {
      const peer = line.trim().split(/\s+/)[3];
      const m = peer && /^(?:\[::ffff:)?(\d+\.\d+\.\d+\.\d+)\]?:(\d+)$/.exec(peer);
      if (!m || m[1]!.startsWith('127.') || allowed(m[1]!, Number(m[2]))) continue;
      filters.push(['dst', m[1]!, 'and', 'dport', '=', `:${m[2]}`]);
    }
    if (filters.length === 0) return;
    const expr = filters.flatMap((f, i) => [...(i ? ['or'] : []), '(', ...f, ')']);
    const killed = await run('nsenter', [`--net=${netns}`, '--', 'ss', '-K', '-tnH', 'state', 'established', ...expr]);
    if (killed.code !== 0) this.log?.warn({ netns, stderr: killed.stderr.trim() }, 'could not reset connections the new policy forbids');
  }

  /** A free /30 of the pool, claimed with an exclusive create (several workers may share the host). */
  private async claimSlot(sandboxId: string): Promise<Slot> {
    const index = await this.leases.claim(sandboxId, poolSlots(this.poolCidr));
    if (index === undefined) throw new RollboxError('no_capacity', `no free address in the veth pool ${this.poolCidr}`);
    return slotOf(this.poolCidr, index);
  }
}

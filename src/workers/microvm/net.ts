import { createHash } from 'node:crypto';
import { RollboxError, type NetworkPolicy } from '../../api/index.ts';
import { runTool, runToolOk } from '../../proc/index.ts';
import type { SandboxNetworks } from '../network/index.ts';

/** Inside a microVM's network namespace: the tap QEMU opens, and the bridge joining it to the sandbox's veth. */
export const VM_TAP = 'tap0';
export const VM_BRIDGE = 'br0';

/** What a microVM with a NIC has on the host: its namespace (named, so it exists before QEMU does). */
export interface VmNic {
  netns: string;
  /** Guest side: `a.b.c.d/30` and its gateway (the platform's resolver too). */
  address: string;
  gateway: string;
}

/** `rbvm` + 12 hex of the sandbox id's hash: one name per sandbox, found again after a restart. */
export function vmNetnsOf(sandboxId: string): string {
  return `rbvm-${createHash('sha256').update(sandboxId).digest('hex').slice(0, 12)}`;
}

export const netnsPathOf = (name: string): string => `/run/netns/${name}`;

/**
 * The namespace QEMU runs in, ready for `SandboxNetworks.apply(..., { bridge })`: loopback,
 * a persistent tap (QEMU opens it by name, so the bridge can be built before QEMU starts)
 * and a bridge holding it. Bridged frames skip the namespace's IP hooks
 * (`bridge-nf-call-*` 0), so whether the host loaded br_netfilter does not change what
 * passes: the sandbox's allowlist is enforced on the host's forward path, by the same
 * per-sandbox chain a container gets (source pinned to the sandbox's address, blocked
 * ranges, allow rules, every packet), and nothing reaches the host but DNS to its resolver.
 */
async function createVmNetns(name: string): Promise<void> {
  await runTool('ip', ['netns', 'del', name]);
  await runToolOk('ip', ['netns', 'add', name]);
  const script = [
    'set -e',
    'for f in /proc/sys/net/bridge/bridge-nf-call-iptables /proc/sys/net/bridge/bridge-nf-call-ip6tables /proc/sys/net/bridge/bridge-nf-call-arptables; do [ ! -e $f ] || echo 0 > $f; done',
    'echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6',
    `ip -batch - <<'EOF'`,
    'link set lo up',
    `tuntap add dev ${VM_TAP} mode tap`,
    `link add ${VM_BRIDGE} type bridge`,
    `link set ${VM_TAP} master ${VM_BRIDGE}`,
    `link set ${VM_TAP} up`,
    `link set ${VM_BRIDGE} up`,
    'EOF',
  ].join('\n');
  await runToolOk('nsenter', [`--net=${netnsPathOf(name)}`, '--', 'sh', '-c', script]);
}

/**
 * A microVM's network at create: none for mode none (QEMU gets no NIC at all), else its
 * namespace, the sandbox's veth, rules and DNS responder (SandboxNetworks, as for a
 * container) and the addresses the guest takes.
 */
export async function attachVmNetwork(networks: SandboxNetworks | undefined, sandboxId: string, policy: NetworkPolicy | undefined): Promise<VmNic | undefined> {
  if (!policy || policy.mode === 'none') return undefined;
  if (!networks) throw new RollboxError('invalid_request', 'network mode allowlist is not available on this worker host');
  const netns = vmNetnsOf(sandboxId);
  await createVmNetns(netns);
  await networks.apply(sandboxId, netnsPathOf(netns), policy, { bridge: VM_BRIDGE });
  const addr = networks.addressOf(sandboxId)!;
  return { netns, address: `${addr.sandboxAddress}/30`, gateway: addr.hostAddress };
}

/**
 * What the host applies for a VM that has a NIC. Its address was given to the guest at
 * boot, so the lease must outlive a stage with mode none: that stage is an allowlist of
 * nothing (every packet refused on the host, the resolver answering NXDOMAIN to every
 * name) on the same veth, and a later allowlist stage finds the guest's address still valid.
 */
export function nicPolicy(policy: NetworkPolicy): NetworkPolicy {
  return policy.mode === 'none' ? { mode: 'allowlist', allow: [] } : policy;
}

/** Everything of a microVM's network on the host; its tap and bridge end with the namespace. Idempotent. */
export async function releaseVmNetwork(networks: SandboxNetworks | undefined, sandboxId: string): Promise<void> {
  await networks?.release(sandboxId);
  await runTool('ip', ['netns', 'del', vmNetnsOf(sandboxId)]);
}

import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile, readdir, unlink } from 'node:fs/promises';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { runTool, runToolOk } from '../../proc/index.ts';
import type { SandboxNetworks } from './sandbox-networks.ts';
import { claimLeaseFile } from './leases.ts';
import { formatIpv4, ipv4Range } from './rules.ts';

/** What a worker host knows about its sandboxes' network, as its heartbeat reports it. */
export interface NetworkHealth {
  /** `ok`: the last self-test passed; `failing`: allowlist sandboxes are not placed here. */
  allowlist: 'ok' | 'failing';
  checkedAtMs: number;
  /** Why it fails, naming the cause (and what stands on the path). */
  detail?: string;
  /** Where rollbox's accept rules sit in other rule sets of this host. */
  firewall: string[];
  /** Where they were gone (flushed by another rule set's owner) and were put back before this round. */
  putBack?: string[];
}

export interface SelfTestDeps {
  networks: SandboxNetworks;
  nodeId: string;
  /** Addresses for the probe's "outside" (one /29 per worker host, leased in the lease dir). */
  probeCidr: string;
  /** Time between rounds while they pass. */
  intervalMs: number;
  now?: () => number;
}

const PROBE_PORT = 7;
/** While rounds fail, the next comes this soon (an operator fixing the host sees it pass). */
const FAILING_RECHECK_MS = 5000;
/** How long a probe connection may take; a dropped SYN is a failure after this. */
const CONNECT_TIMEOUT_SEC = 2;
/** Stands for "the outside": answers every connection with the address it came from. */
const LISTENER = String.raw`
require('node:net').createServer((s) => { s.on('error', () => {}); s.end('rollbox-probe ' + s.remoteAddress.replace('::ffff:', '') + '\n'); })
  .listen(Number(process.argv[1]), '0.0.0.0', () => process.stdout.write('ready\n'));
`;

/**
 * Proves, rather than assumes, that this host forwards sandbox traffic as the allowlist
 * says. Each round builds a probe "sandbox" (a network namespace of its own, attached by
 * the same code as every sandbox: veth, both rulesets, host chain, DNS responder) and a
 * probe "outside" (a second namespace behind a veth of the host, so packets take the same
 * forward hook, NAT and rules as real egress), then checks:
 *   - a TCP connection to the allowlisted address reaches it, masqueraded (the outside sees
 *     a host address, never a pool address);
 *   - the same port on an address outside the allowlist does not;
 *   - the sandbox's DNS resolver on the veth's host end answers.
 * Everything is removed after the round. Names derive from the node id, so a round cut
 * short by a crash is cleaned up by the next. Between rounds, `tick` keeps rollbox's rules
 * in the host's other rule sets and runs a round at once when it had to put any back.
 */
export class NetworkSelfTest {
  private readonly tag: string;
  private readonly srcNetns: string;
  private readonly dstNetns: string;
  private readonly dstVeth: string;
  private readonly probeId: string;
  private readonly now: () => number;
  private last: NetworkHealth | undefined;
  /** The last round's probe being removed. */
  private tearingDown: Promise<void> = Promise.resolve();

  constructor(private readonly deps: SelfTestDeps) {
    this.tag = createHash('sha256').update(deps.nodeId).digest('hex').slice(0, 12);
    this.srcNetns = `rollbox-probe-${this.tag}`;
    this.dstNetns = `rollbox-probe-${this.tag}-out`;
    this.dstVeth = `rpo${this.tag}`;
    this.probeId = `probe-${deps.nodeId}`;
    this.now = deps.now ?? Date.now;
    if (!ipv4Range(deps.probeCidr)) throw new Error(`invalid probe CIDR ${deps.probeCidr}`);
  }

  /**
   * Called every few seconds. Puts rollbox's rules back where the host's firewall lost
   * them, and runs a round when one is due (the first call, the interval, sooner while
   * failing, or at once after rules had to be put back). Returns the verdict when a round ran.
   */
  async tick(): Promise<NetworkHealth | undefined> {
    let putBack: string[] = [];
    if (this.last) putBack = (await this.deps.networks.prepareHost().catch(() => ({ added: ['(could not check)'] }))).added;
    const dueMs = this.last?.allowlist === 'failing' ? Math.min(FAILING_RECHECK_MS, this.deps.intervalMs) : this.deps.intervalMs;
    if (this.last && putBack.length === 0 && this.now() - this.last.checkedAtMs < dueMs) return undefined;
    return this.run(putBack);
  }

  /** One round; its verdict also gates `networks.apply` (no allowlist network while failing). */
  async run(putBack: string[] = []): Promise<NetworkHealth> {
    const health = await this.round();
    if (putBack.length) health.putBack = putBack;
    this.last = health;
    this.deps.networks.failing = health.allowlist === 'failing' ? health.detail : undefined;
    return health;
  }

  private async round(): Promise<NetworkHealth> {
    const { networks } = this.deps;
    let firewall: string[] = [];
    let listener: ChildProcess | undefined;
    let leaseIndex: number | undefined;
    await this.tearingDown;
    const leftoverLease = await this.leftoverProbeLease();
    if (leftoverLease !== undefined || this.probeLinksLeft()) await this.teardown(undefined, leftoverLease);
    try {
      leaseIndex = await this.claimProbeAddresses();
      const [outside, allowed, other] = [1, 2, 3].map((i) => formatIpv4(ipv4Range(this.deps.probeCidr)![0] + leaseIndex! * 8 + i)) as [string, string, string];
      // Three independent lines side by side (each spawns tools; a worker host waits for this
      // round before it reports ready): the host's rules; the probe sandbox's namespace, then
      // its network; the outside's namespace, then its listener. All end before the verdict
      // or the teardown (a failed line does not leave another one running).
      const lines = await Promise.allSettled([
        networks.prepareHost().then((r) => r.placed),
        this.buildSource().then(() => networks.apply(this.probeId, this.nsPath(this.srcNetns), { mode: 'allowlist', allow: [{ cidr: `${allowed}/32`, ports: [PROBE_PORT], protocol: 'tcp' }] }, { probe: true })),
        this.buildOutside(outside, allowed, other).then(() => {
          const started = this.startListener();
          listener = started.child;
          return started.ready;
        }),
      ]);
      const failed = lines.find((l) => l.status === 'rejected');
      if (failed) throw failed.reason;
      firewall = (lines[0] as PromiseFulfilledResult<string[]>).value;
      const resolver = networks.resolverOf(this.probeId)!;
      const [reached, leaked, dns] = await Promise.all([this.connect(allowed), this.connect(other), this.lookup(resolver)]);
      const problems: string[] = [];
      const seenFrom = /rollbox-probe (\S+)/.exec(reached)?.[1];
      if (!seenFrom) problems.push(`an allowlisted destination (${allowed}:${PROBE_PORT}, behind this host's forward path) was not reachable from a sandbox network`);
      else if (ipv4Range(`${seenFrom}/32`) && isInside(seenFrom, networks.poolCidr)) problems.push(`traffic left the host unmasqueraded (the outside saw ${seenFrom}, a veth pool address)`);
      if (/rollbox-probe/.test(leaked)) problems.push(`a destination outside the allowlist (${other}:${PROBE_PORT}) was reachable`);
      if (!/NXDOMAIN|can't find/.test(dns)) problems.push(`the sandbox DNS resolver on ${resolver} did not answer`);
      if (problems.length === 0) return { allowlist: 'ok', checkedAtMs: this.now(), firewall };
      return { allowlist: 'failing', checkedAtMs: this.now(), detail: `${problems.join('; ')} (host: ${await networks.diagnoseHost().catch((err: unknown) => String(err))})`, firewall };
    } catch (err) {
      return { allowlist: 'failing', checkedAtMs: this.now(), detail: `network self-test could not run: ${err instanceof Error ? err.message : String(err)}`, firewall };
    } finally {
      // The verdict does not wait for the probe's removal: the next round and `settled` do.
      this.tearingDown = this.teardown(listener, leaseIndex).catch(() => undefined);
    }
  }

  /** Resolves once the last round's probe is removed (a worker host's stop waits for it). */
  settled(): Promise<void> {
    return this.tearingDown;
  }

  /** A /29 of the probe range for this host: outside's host end .1, allowlisted .2, not allowlisted .3. */
  private async claimProbeAddresses(): Promise<number> {
    const slots = Math.floor((ipv4Range(this.deps.probeCidr)![1] - ipv4Range(this.deps.probeCidr)![0] + 1) / 8);
    const index = await claimLeaseFile(this.deps.networks.leaseDir, (i) => `probe-${i}`, slots, parseInt(this.tag.slice(0, 6), 16) % slots, `${this.deps.nodeId}\n`);
    if (index === undefined) throw new Error(`no free /29 in the probe range ${this.deps.probeCidr}`);
    return index;
  }

  /** A probe lease of this node left by a round that a crash cut short. */
  private async leftoverProbeLease(): Promise<number | undefined> {
    const dir = this.deps.networks.leaseDir;
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      const index = /^probe-(\d+)$/.exec(name)?.[1];
      if (index && (await readFile(path.join(dir, name), 'utf8').catch(() => '')).trim() === this.deps.nodeId) return Number(index);
    }
    return undefined;
  }

  private async buildSource(): Promise<void> {
    await runToolOk('ip', ['netns', 'add', this.srcNetns]);
    // Up as in a container: a refusal's TCP reset is delivered to the socket through it.
    await runToolOk('ip', ['-n', this.srcNetns, 'link', 'set', 'lo', 'up']);
  }

  private async buildOutside(outside: string, allowed: string, other: string): Promise<void> {
    await runToolOk('ip', ['netns', 'add', this.dstNetns]);
    await runToolOk('ip', ['-batch', '-'], { input: [`link add ${this.dstVeth} type veth peer name eth0 netns ${this.dstNetns}`, `addr add ${outside}/29 dev ${this.dstVeth}`, `link set ${this.dstVeth} up`, ''].join('\n') });
    await runToolOk('ip', ['-n', this.dstNetns, '-batch', '-'], { input: ['link set lo up', `addr add ${allowed}/29 dev eth0`, `addr add ${other}/29 dev eth0`, 'link set eth0 up', `route add default via ${outside}`, ''].join('\n') });
  }

  private startListener(): { child: ChildProcess; ready: Promise<void> } {
    const child = spawn('nsenter', [`--net=${this.nsPath(this.dstNetns)}`, '--', process.execPath, '-e', LISTENER, String(PROBE_PORT)], { stdio: ['ignore', 'pipe', 'ignore'] });
    const ready = new Promise<void>((resolve, reject) => {
      child.once('error', reject);
      child.once('close', (code) => reject(new Error(`probe listener exited ${code}`)));
      createInterface({ input: child.stdout! }).once('line', () => resolve());
    });
    return { child, ready };
  }

  /** Whether a probe's namespaces or outside veth are still there (a round cut short by a crash). */
  private probeLinksLeft(): boolean {
    return [this.nsPath(this.srcNetns), this.nsPath(this.dstNetns), `/sys/class/net/${this.dstVeth}`].some((p) => existsSync(p));
  }

  private async connect(address: string): Promise<string> {
    return (await runTool('nsenter', [`--net=${this.nsPath(this.srcNetns)}`, '--', 'busybox', 'nc', '-w', String(CONNECT_TIMEOUT_SEC), address, String(PROBE_PORT)], { input: '' })).stdout;
  }

  private async lookup(resolver: string): Promise<string> {
    const r = await runTool('nsenter', [`--net=${this.nsPath(this.srcNetns)}`, '--', 'busybox', 'timeout', String(CONNECT_TIMEOUT_SEC + 1), 'busybox', 'nslookup', 'rollbox-probe.invalid', resolver]);
    return r.stdout + r.stderr;
  }

  private async teardown(listener: ChildProcess | undefined, leaseIndex: number | undefined): Promise<void> {
    if (listener && listener.exitCode === null && listener.signalCode === null) {
      const closed = new Promise((r) => listener.once('close', r));
      listener.kill('SIGKILL');
      await closed;
    }
    await this.deps.networks.release(this.probeId);
    // Deleted here, not left to the namespace's (asynchronous) destruction: the next round reuses the name.
    await runTool('ip', ['link', 'del', this.dstVeth]);
    for (const name of [this.srcNetns, this.dstNetns]) await runTool('ip', ['netns', 'del', name]);
    if (leaseIndex !== undefined) await unlink(path.join(this.deps.networks.leaseDir, `probe-${leaseIndex}`)).catch(() => undefined);
  }

  private nsPath(name: string): string {
    return `/run/netns/${name}`;
  }
}

function isInside(ip: string, cidr: string): boolean {
  const [s, e] = ipv4Range(cidr)!;
  const [n] = ipv4Range(ip)!;
  return n >= s && n <= e;
}

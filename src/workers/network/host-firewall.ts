import { mkdir, readFile, unlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { runTool } from '../../proc/index.ts';

export interface NetworkLogger {
  warn(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
}

/**
 * rollbox beside the host's other firewalls. A packet passes a netfilter hook only if
 * every base chain registered there accepts it: Docker's iptables `FORWARD` policy `DROP`
 * (iptables-nft or iptables-legacy), ufw, firewalld or a Kubernetes node drop sandbox
 * traffic whatever rollbox's own table says. So, where another rule set filters a path
 * sandbox traffic takes, this adds accept rules at its head (in `DOCKER-USER` where it
 * exists, the chain Docker keeps for its users), scoped to rollbox's traffic only: in on a
 * rollbox veth (`rb*`) from the veth pool, back out to the pool on established flows, and
 * DNS between a sandbox and its resolver on the veth's host end. What those packets may
 * do is still decided by rollbox's own table (per-sandbox allowlists); the added rules
 * only stop the other rule set from deciding for it. Every rule carries the comment
 * `rollbox:<nodeId>`, and `remove` deletes exactly those.
 *
 * Chains are touched only when they can drop something (a drop policy, or rules of their
 * own); base chains at other hooks (prerouting, postrouting) are left alone and named by
 * `diagnose` when the self-test fails.
 */
export interface HostFirewallDeps {
  nodeId: string;
  poolCidr: string;
  /** Host-wide state (the lease dir): where the original `ip_forward` is kept while rollbox changed it. */
  stateDir: string;
  log?: NetworkLogger;
}

/** The paths sandbox traffic takes through the host: forwarded both ways, DNS in and out. */
type SandboxPath = 'forward' | 'input' | 'output';
const PATH_CHAINS: Record<SandboxPath, string> = { forward: 'FORWARD', input: 'INPUT', output: 'OUTPUT' };
const IPTABLES_BACKENDS = ['iptables-nft', 'iptables-legacy'] as const;
type IptablesBackend = (typeof IPTABLES_BACKENDS)[number];
/** nft tables that iptables-nft owns; native nft rules in them would break its parser. */
const IPTABLES_NFT_TABLES = new Set(['filter', 'nat', 'mangle', 'raw', 'security']);
const IP_FORWARD = '/proc/sys/net/ipv4/ip_forward';
const OUTPUT_CAP_BYTES = 16 * 1024 * 1024;

/** iptables rule specs (after the chain name) for each path. */
export function iptablesRules(poolCidr: string, comment: string): Record<SandboxPath, string[][]> {
  const tag = ['-m', 'comment', '--comment', comment, '-j', 'ACCEPT'];
  return {
    forward: [
      ['-i', 'rb+', '-s', poolCidr, ...tag],
      ['-o', 'rb+', '-d', poolCidr, '-m', 'conntrack', '--ctstate', 'RELATED,ESTABLISHED', ...tag],
    ],
    input: [['-i', 'rb+', '-s', poolCidr, '-d', poolCidr, '-p', 'udp', '--dport', '53', ...tag]],
    output: [['-o', 'rb+', '-s', poolCidr, '-d', poolCidr, '-p', 'udp', '--sport', '53', ...tag]],
  };
}

/** The same rules in nft syntax, for base chains of native nftables tables of other owners. */
export function nftRules(poolCidr: string, comment: string): Record<SandboxPath, string[]> {
  const tag = `accept comment "${comment}"`;
  return {
    forward: [`iifname "rb*" ip saddr ${poolCidr} ${tag}`, `oifname "rb*" ip daddr ${poolCidr} ct state established,related ${tag}`],
    input: [`iifname "rb*" ip saddr ${poolCidr} ip daddr ${poolCidr} udp dport 53 ${tag}`],
    output: [`oifname "rb*" ip saddr ${poolCidr} ip daddr ${poolCidr} udp sport 53 ${tag}`],
  };
}

/** One iptables table as `iptables -S` prints it: chain policies and rules per chain. */
export interface IptablesListing {
  policies: Map<string, string>;
  chains: Set<string>;
  rules: Map<string, string[]>;
}

export function parseIptablesListing(text: string): IptablesListing {
  const listing: IptablesListing = { policies: new Map(), chains: new Set(), rules: new Map() };
  for (const line of text.split('\n')) {
    const [verb, chain, ...rest] = line.trim().split(' ');
    if (!chain) continue;
    if (verb === '-P') listing.policies.set(chain, rest[0] ?? '');
    if (verb === '-P' || verb === '-N') listing.chains.add(chain);
    if (verb === '-A') listing.rules.set(chain, [...(listing.rules.get(chain) ?? []), line.trim()]);
  }
  return listing;
}

interface NftChain {
  family: string;
  table: string;
  name: string;
  hook?: string;
  policy?: string;
  type?: string;
  prio?: number;
}
interface NftRule {
  family: string;
  table: string;
  chain: string;
  handle: number;
  comment?: string;
}

/** Base chains and rules of `nft -j list ruleset`. */
export function parseNftRuleset(json: string): { chains: NftChain[]; rules: NftRule[] } {
  const items = ((JSON.parse(json || '{"nftables":[]}') as { nftables: Record<string, unknown>[] }).nftables ?? []);
  return {
    chains: items.flatMap((i) => (i.chain ? [i.chain as NftChain] : [])),
    rules: items.flatMap((i) => (i.rule ? [i.rule as NftRule] : [])),
  };
}

const run = (file: string, args: readonly string[], input?: string) => runTool(file, args, { input, capBytes: OUTPUT_CAP_BYTES });

export class HostFirewall {
  private readonly comment: string;

  constructor(private readonly deps: HostFirewallDeps) {
    this.comment = `rollbox:${deps.nodeId}`;
  }

  /**
   * Adds this node's accept rules wherever another rule set filters a sandbox path and
   * they are missing (Docker or firewalld may have flushed them since). Idempotent, and
   * cheap when nothing changed (one listing per rule set). Returns where the rules are,
   * e.g. `iptables-nft filter DOCKER-USER (forward)`, and where they had to be (re)added;
   * throws when a rule set is in the way and cannot be changed.
   */
  async ensure(): Promise<{ placed: string[]; added: string[] }> {
    const placed: string[] = [];
    const added: string[] = [];
    for (const backend of await this.iptablesBackendsInUse()) {
      const listing = await this.iptablesListing(backend);
      const wanted = iptablesRules(this.deps.poolCidr, this.comment);
      for (const [p, chain] of Object.entries(PATH_CHAINS) as [SandboxPath, string][]) {
        if (!this.filters(listing.policies.get(chain), (listing.rules.get(chain) ?? []).filter((r) => !this.isOurs(r)).length)) continue;
        // Docker jumps to DOCKER-USER before its own rules and leaves it to its users.
        const target = p === 'forward' && listing.chains.has('DOCKER-USER') ? 'DOCKER-USER' : chain;
        const where = `${backend} filter ${target} (${p})`;
        placed.push(where);
        const ours = (listing.rules.get(target) ?? []).filter((r) => this.isOurs(r));
        if (ours.length === wanted[p].length) continue;
        for (const line of ours) await this.deleteIptablesRule(backend, line);
        for (const spec of wanted[p]) {
          const inserted = await run(backend, ['-w', '-I', target, '1', ...spec]);
          if (inserted.code !== 0) throw new Error(`${backend}: could not add rollbox's rule to ${target}: ${inserted.stderr.trim()}`);
        }
        added.push(where);
      }
    }
    const { chains, rules } = await this.nftRuleset();
    const wanted = nftRules(this.deps.poolCidr, this.comment);
    for (const chain of this.foreignNftChains(chains, ['forward', 'input', 'output'])) {
      const p = chain.hook as SandboxPath;
      const inChain = rules.filter((r) => r.family === chain.family && r.table === chain.table && r.chain === chain.name);
      const ours = inChain.filter((r) => r.comment === this.comment);
      if (!this.filters(chain.policy, inChain.length - ours.length)) continue;
      const ref = `${chain.family} ${chain.table} ${chain.name}`;
      placed.push(`nft ${ref} (${p})`);
      if (ours.length === wanted[p].length) continue;
      const script = [...ours.map((r) => `delete rule ${ref} handle ${r.handle}`), ...wanted[p].map((rule) => `insert rule ${ref} ${rule}`), ''].join('\n');
      const inserted = await run('nft', ['-f', '-'], script);
      if (inserted.code !== 0) throw new Error(`nft: could not add rollbox's rules to ${ref}: ${inserted.stderr.trim()}`);
      added.push(`nft ${ref} (${p})`);
    }
    return { placed, added };
  }

  /** Deletes every rule this node added, in every rule set. */
  async remove(): Promise<void> {
    for (const backend of await this.iptablesBackendsInUse()) {
      const listing = await this.iptablesListing(backend);
      for (const line of [...listing.rules.values()].flat()) if (this.isOurs(line)) await this.deleteIptablesRule(backend, line);
    }
    const { rules } = await this.nftRuleset();
    const script = rules.filter((r) => r.comment === this.comment).map((r) => `delete rule ${r.family} ${r.table} ${r.chain} handle ${r.handle}`);
    if (script.length) await run('nft', ['-f', '-'], `${script.join('\n')}\n`);
  }

  /** A line of `iptables -S` that is one of this node's rules (`-S` quotes the comment). */
  private isOurs(line: string): boolean {
    return line.includes(`--comment "${this.comment}"`);
  }

  private async deleteIptablesRule(backend: IptablesBackend, line: string): Promise<void> {
    // Our comment holds no space: without the quotes, the line's words are the rule's spec.
    const removed = await run(backend, ['-w', '-D', ...line.replaceAll('"', '').split(' ').slice(1)]);
    if (removed.code !== 0) this.deps.log?.warn({ backend, rule: line, stderr: removed.stderr.trim() }, 'could not remove a rollbox rule');
  }

  /**
   * `ip_forward` on, for sandbox traffic to leave the host. When rollbox is the one that
   * turned it on, the original value is kept in the state dir (host-wide: workers share it)
   * for `restoreForwarding`.
   */
  async enableForwarding(): Promise<void> {
    if ((await readFile(IP_FORWARD, 'utf8')).trim() === '1') return;
    await mkdir(this.deps.stateDir, { recursive: true, mode: 0o700 });
    await writeFile(this.forwardingRecord(), '0\n', { flag: 'wx' }).catch(() => undefined);
    await writeFile(IP_FORWARD, '1');
    this.deps.log?.info({}, 'enabled net.ipv4.ip_forward for sandbox networking (restored when the last rollbox worker on this host stops)');
  }

  /** Puts `ip_forward` back as rollbox found it, once no rollbox table is left on the host. */
  async restoreForwarding(): Promise<void> {
    const original = await readFile(this.forwardingRecord(), 'utf8').catch(() => undefined);
    if (original === undefined) return;
    const tables = (await run('nft', ['list', 'tables'])).stdout;
    if (/table inet rollbox-/.test(tables)) return;
    await writeFile(IP_FORWARD, original.trim());
    await unlink(this.forwardingRecord()).catch(() => undefined);
    this.deps.log?.info({}, `restored net.ipv4.ip_forward to ${original.trim()}`);
  }

  /**
   * Why sandbox traffic may not pass, for a failed self-test: the settings on its path and
   * the other rule sets' base chains that could drop it (those at hooks rollbox leaves alone
   * included).
   */
  async diagnose(): Promise<string> {
    const facts: string[] = [];
    const sysctl = async (name: string) => (await readFile(`/proc/sys/net/${name}`, 'utf8').catch(() => '?')).trim();
    facts.push(`ip_forward=${await sysctl('ipv4/ip_forward')}`, `rp_filter all=${await sysctl('ipv4/conf/all/rp_filter')}`);
    const [count, max] = [await sysctl('netfilter/nf_conntrack_count'), await sysctl('netfilter/nf_conntrack_max')];
    facts.push(`conntrack ${count}/${max}`);
    for (const backend of IPTABLES_BACKENDS) {
      for (const table of (await this.iptablesTables(backend)).filter((t) => ['raw', 'mangle', 'filter'].includes(t))) {
        const listed = await run(backend, ['-w', '-t', table, '-S']);
        if (listed.code !== 0) continue;
        const listing = parseIptablesListing(listed.stdout);
        for (const [chain, policy] of listing.policies) {
          const rules = listing.rules.get(chain)?.length ?? 0;
          if (this.filters(policy, rules)) facts.push(`${backend} ${table} ${chain} (policy ${policy}, ${rules} rules)`);
        }
      }
    }
    const { chains, rules } = await this.nftRuleset();
    for (const chain of this.foreignNftChains(chains, ['prerouting', 'forward', 'input', 'output', 'postrouting'])) {
      const count = rules.filter((r) => r.family === chain.family && r.table === chain.table && r.chain === chain.name).length;
      if (this.filters(chain.policy, count)) facts.push(`nft ${chain.family} ${chain.table} ${chain.name} (hook ${chain.hook}, policy ${chain.policy ?? 'accept'}, ${count} rules)`);
    }
    return facts.join('; ');
  }

  /** A chain that can drop: a drop policy, or rules of its own. */
  private filters(policy: string | undefined, ownRules: number): boolean {
    return policy?.toLowerCase() === 'drop' || ownRules > 0;
  }

  /** Filter base chains of native nftables tables other than rollbox's and iptables-nft's. */
  private foreignNftChains(chains: NftChain[], hooks: string[]): NftChain[] {
    return chains.filter(
      (c) =>
        c.hook !== undefined &&
        hooks.includes(c.hook) &&
        c.type === 'filter' &&
        (c.family === 'ip' || c.family === 'inet') &&
        !c.table.startsWith('rollbox-') &&
        !(c.family === 'ip' && IPTABLES_NFT_TABLES.has(c.table)),
    );
  }

  /** The iptables backends whose filter table exists. */
  private async iptablesBackendsInUse(): Promise<IptablesBackend[]> {
    const inUse: IptablesBackend[] = [];
    for (const backend of IPTABLES_BACKENDS) if ((await this.iptablesTables(backend)).includes('filter')) inUse.push(backend);
    return inUse;
  }

  /**
   * The tables a backend has, read without the iptables tools: listing a table that does
   * not exist yet would create it (and change the host's rule sets).
   */
  private async iptablesTables(backend: IptablesBackend): Promise<string[]> {
    if (backend === 'iptables-legacy') return (await readFile('/proc/net/ip_tables_names', 'utf8').catch(() => '')).split('\n').filter(Boolean);
    return [...(await run('nft', ['list', 'tables', 'ip'])).stdout.matchAll(/^table ip (\S+)$/gm)].map((m) => m[1]!).filter((t) => IPTABLES_NFT_TABLES.has(t));
  }

  private async iptablesListing(backend: IptablesBackend): Promise<IptablesListing> {
    // Its tables are in use, so a missing binary is a host to fix, not one to skip.
    const listed = await run(backend, ['-w', '-S']).catch((err: unknown) => {
      throw new Error(`${backend} is needed (its filter table is in use) and could not run; install Debian's iptables package: ${String(err)}`);
    });
    if (listed.code !== 0) throw new Error(`${backend} -S failed: ${listed.stderr.trim()}`);
    return parseIptablesListing(listed.stdout);
  }

  private async nftRuleset(): Promise<ReturnType<typeof parseNftRuleset>> {
    const listed = await run('nft', ['-j', 'list', 'ruleset']);
    if (listed.code !== 0) throw new Error(`nft -j list ruleset failed: ${listed.stderr.trim()}`);
    return parseNftRuleset(listed.stdout);
  }

  private forwardingRecord(): string {
    return path.join(this.deps.stateDir, 'ip_forward.orig');
  }
}

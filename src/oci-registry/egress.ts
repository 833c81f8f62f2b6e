import dns from 'node:dns';
import net, { type LookupFunction } from 'node:net';
import { RollboxError } from '../api/index.ts';

/**
 * Where image pulls may go (operator config). A registry names the hosts a pull then talks
 * to (redirects, token realms), so each one is checked: its scheme, its port and, at every
 * connection, each address its name resolves to.
 */
export interface EgressPolicy {
  /** Registries (`host[:port]`, a bare host: any port) a ref may name; empty: any. */
  allowed: ReadonlySet<string>;
  /** Hosts (`host[:port]`, a bare host: any port) that may be reached on loopback, link-local or private addresses. */
  internal: ReadonlySet<string>;
}

/**
 * Addresses a pull reaches only on hosts configured internal: loopback, link-local (cloud
 * metadata), private and shared (CGNAT) ranges, "this network", multicast and reserved, and
 * their IPv6 counterparts (IPv4-mapped IPv6 is checked as the IPv4 address it carries).
 */
const INTERNAL = new net.BlockList();
for (const [prefix, bits] of [['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12], ['192.0.0.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15], ['224.0.0.0', 4], ['240.0.0.0', 4]] as const) INTERNAL.addSubnet(prefix, bits, 'ipv4');
for (const [prefix, bits] of [['::', 128], ['::1', 128], ['fc00::', 7], ['fe80::', 10], ['ff00::', 8], ['64:ff9b::', 96]] as const) INTERNAL.addSubnet(prefix, bits, 'ipv6');

/** A loopback, link-local, private or otherwise non-public address. */
export function isInternalAddress(address: string): boolean {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
  if (mapped) return INTERNAL.check(mapped, 'ipv4');
  const family = net.isIP(address);
  if (family === 0) return true; // not an address at all: never trusted
  return INTERNAL.check(address, family === 4 ? 'ipv4' : 'ipv6');
}

const defaultPort = (url: URL): string => url.port || (url.protocol === 'https:' ? '443' : '80');
/** `host` or `host:port` in the form config lists them (IPv6 in brackets, as URLs write it). */
const listed = (set: ReadonlySet<string>, url: URL): boolean => set.has(url.hostname.toLowerCase()) || set.has(`${url.hostname.toLowerCase()}:${defaultPort(url)}`);

/** A ref's registry, before anything is fetched: refused unless the operator's allowlist (if any) names it. */
export function checkRegistryAllowed(registry: string, policy: EgressPolicy): void {
  if (policy.allowed.size === 0) return;
  const [host] = registry.split(/:(?=\d+$)/);
  if (policy.allowed.has(registry) || policy.allowed.has(host!)) return;
  throw new RollboxError('registry_not_allowed', `registry ${registry} is not in ROLLBOX_REGISTRY_ALLOW`);
}

/**
 * A URL a pull is about to request (a registry, a mirror, a redirect's target, a token
 * realm): http or https, a port other than 0, and an address literal only if it is public
 * or the host is configured internal. Names are checked as they resolve (`lookupFor`).
 */
export function checkDestination(url: URL, policy: EgressPolicy, what: string): void {
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new RollboxError('registry_not_allowed', `${what}: only http and https are allowed, not ${url.protocol.slice(0, 16)}`);
  if (url.port === '0') throw new RollboxError('registry_not_allowed', `${what}: port 0 is not a port`);
  const literal = url.hostname.replace(/^\[(.*)\]$/, '$1');
  if (net.isIP(literal) && isInternalAddress(literal) && !listed(policy.internal, url)) throw notInternal(url, what);
}

function notInternal(url: URL, what: string): RollboxError {
  return new RollboxError('registry_not_allowed', `${what}: ${url.host} is a loopback, link-local or private address, and not listed in ROLLBOX_REGISTRY_INTERNAL`);
}

/**
 * The `lookup` of a connection to `url`: the name resolved as usual, and refused when an
 * address it resolves to is internal and the host is not configured so. Checked at connect
 * time, on the addresses connected to, so a name that resolves differently later
 * (DNS rebinding) is checked again.
 */
export function lookupFor(url: URL, policy: EgressPolicy, what: string): LookupFunction | undefined {
  if (listed(policy.internal, url)) return undefined;
  return ((hostname: string, options: dns.LookupOptions, callback: (err: NodeJS.ErrnoException | null, address: string | dns.LookupAddress[], family?: number) => void) => {
    dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, []);
      if (addresses.length === 0 || addresses.some((a) => isInternalAddress(a.address))) return callback(notInternal(url, what) as NodeJS.ErrnoException, []);
      if (options.all) return callback(null, addresses);
      callback(null, addresses[0]!.address, addresses[0]!.family);
    });
  }) as LookupFunction;
}

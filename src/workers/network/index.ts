// The sandboxes' networks on a worker host: per-sandbox namespaces, veths and rulesets
// (sandbox-networks.ts), the host's firewall, the DNS responder and the self-test.
export { answer as dnsAnswer, parseQuery as parseDnsQuery } from './dns.ts';
export { renderSandboxRuleset, renderHostBase, renderHostSandboxChain, ALWAYS_BLOCKED_V4 } from './rules.ts';
export { NetworkSelfTest, type NetworkHealth } from './self-test.ts';
export { SandboxNetworks, vethOf, type ApplyOptions, type NetnsRef, type SandboxNetworksDeps } from './sandbox-networks.ts';
export type { NetworkLogger } from './host-firewall.ts';

// Traffic into ports of sandboxes: the gateway's proxy (proxy.ts), the worker host's relay
// (relay.ts) and its helper into sandboxes' network namespaces (forwarder.ts,
// rollbox-portfwd.c), and the tickets between them (tickets.ts).
export { PortForwarder, DEFAULT_PORTFWD_BINARY } from './forwarder.ts';
export { PortProxy, type Forwarding, type PortProxyDeps } from './proxy.ts';
export { PortRelay, type PortRelayDeps } from './relay.ts';
export { PortTickets, type PortTarget } from './tickets.ts';

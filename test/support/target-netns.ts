import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';

/**
 * A network namespace the test owns, standing in for "the outside": a veth to the host
 * with test-only addresses, and listeners (a small node program run inside it) that record
 * every TCP connection and UDP datagram they see. Probes from sandboxes go only here.
 */
export interface TargetNetns {
  name: string;
  hostVeth: string;
  /** Host end of the veth (a host address). */
  hostAddress: string;
  /** Addresses inside the namespace: a main one and a second one that policies leave out. */
  address: string;
  otherAddress: string;
  /** An IPv6 ULA address inside the namespace. */
  ulaAddress: string;
  events: TargetEvent[];
  /** Connections seen on `port` (any local address), optionally only to `toAddress`. */
  connections(port: number, toAddress?: string): TargetEvent[];
  datagrams(): TargetEvent[];
  stop(): Promise<void>;
}

export interface TargetEvent {
  ev: 'conn' | 'close' | 'udp';
  port: number;
  local: string;
  from: string;
  data?: string;
  atMs: number;
}

/**
 * TCP ports: on connect each writes `hello <port>` and closes, except `holdPort`, which
 * keeps the connection open and writes a tick every 100 ms. UDP 53 records datagrams.
 */
const LISTENER = String.raw`
const net = require('node:net');
const dgram = require('node:dgram');
const [holdPort, ...ports] = process.argv.slice(1).map(Number);
const log = (e) => process.stdout.write(JSON.stringify({ ...e, atMs: Date.now() }) + '\n');
for (const port of [holdPort, ...ports]) {
  net.createServer((s) => {
    log({ ev: 'conn', port, local: s.localAddress.replace('::ffff:', ''), from: s.remoteAddress.replace('::ffff:', '') });
    s.on('error', () => {});
    s.on('close', () => log({ ev: 'close', port, local: '', from: '' }));
    if (port === holdPort) {
      const t = setInterval(() => s.write('tick\n'), 100);
      s.on('close', () => clearInterval(t));
    } else s.end('hello ' + port + '\n');
  }).listen({ port, host: '::', ipv6Only: false });
}
const u = dgram.createSocket('udp4');
u.on('message', (m, r) => log({ ev: 'udp', port: 53, local: '', from: r.address, data: m.toString('latin1') }));
u.bind(53, () => log({ ev: 'ready', port: 0, local: '', from: '' }));
`;

function sh(cmd: string, args: string[]): string {
  return execFileSync(cmd, args, { encoding: 'utf8' });
}

/** `hostNetns`: the namespace standing for the host (a test's fake host); default the real one. */
export async function startTargetNetns(options: { subnet: number; holdPort: number; ports: number[]; metadataRoute?: boolean; hostNetns?: string }): Promise<TargetNetns> {
  const tag = randomBytes(3).toString('hex');
  const name = `rbtest-${tag}`;
  const hostVeth = `rbt${tag}h`;
  const nsVeth = `rbt${tag}n`;
  const net = `10.251.${options.subnet}`;
  const target: Omit<TargetNetns, 'connections' | 'datagrams' | 'stop'> = {
    name,
    hostVeth,
    hostAddress: `${net}.1`,
    address: `${net}.2`,
    otherAddress: `${net}.3`,
    ulaAddress: `fd99:${options.subnet}::2`,
    events: [],
  };
  let child: ChildProcess | undefined;
  const onHost = options.hostNetns ? ['-n', options.hostNetns] : [];
  const cleanup = async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child!.once('close', r));
      child.kill('SIGKILL');
      await exited;
    }
    if (options.metadataRoute) spawnSyncQuiet('ip', [...onHost, 'route', 'del', '169.254.169.254/32', 'dev', hostVeth]);
    spawnSyncQuiet('ip', [...onHost, 'link', 'del', hostVeth]);
    spawnSyncQuiet('ip', ['netns', 'del', name]);
  };
  try {
    sh('ip', ['netns', 'add', name]);
    sh('ip', [...onHost, 'link', 'add', hostVeth, 'type', 'veth', 'peer', 'name', nsVeth, 'netns', name]);
    sh('ip', [...onHost, 'addr', 'add', `${target.hostAddress}/24`, 'dev', hostVeth]);
    sh('ip', [...onHost, 'link', 'set', hostVeth, 'up']);
    const inNs = (...args: string[]) => sh('ip', ['netns', 'exec', name, ...args]);
    inNs('ip', 'link', 'set', 'lo', 'up');
    inNs('ip', 'addr', 'add', `${target.address}/24`, 'dev', nsVeth);
    inNs('ip', 'addr', 'add', `${target.otherAddress}/24`, 'dev', nsVeth);
    inNs('ip', '-6', 'addr', 'add', `${target.ulaAddress}/64`, 'dev', nsVeth, 'nodad');
    inNs('ip', 'link', 'set', nsVeth, 'up');
    inNs('ip', 'route', 'add', 'default', 'via', target.hostAddress);
    if (options.metadataRoute) {
      // Should anything leak toward the metadata address, it lands here and is recorded,
      // never on a real metadata service.
      inNs('ip', 'addr', 'add', '169.254.169.254/32', 'dev', nsVeth);
      sh('ip', [...onHost, 'route', 'add', '169.254.169.254/32', 'dev', hostVeth]);
    }
    // nsenter --net, not `ip netns exec`: the latter also makes a new mount namespace, a
    // copy of every host mount of the moment (other tests' layer loops, sandbox disks),
    // and this long-lived listener would keep those filesystems and loop devices busy.
    child = spawn('nsenter', [`--net=/run/netns/${name}`, '--', process.execPath, '-e', LISTENER, String(options.holdPort), ...options.ports.map(String)], { stdio: ['ignore', 'pipe', 'inherit'] });
    const ready = new Promise<void>((resolve, reject) => {
      child!.once('close', (code) => reject(new Error(`target listener exited ${code}`)));
      createInterface({ input: child!.stdout! }).on('line', (line) => {
        const e = JSON.parse(line) as TargetEvent | { ev: 'ready' };
        if (e.ev === 'ready') resolve();
        else target.events.push(e);
      });
    });
    await ready;
  } catch (err) {
    await cleanup();
    throw err;
  }
  return {
    ...target,
    connections: (port, toAddress) => target.events.filter((e) => e.ev === 'conn' && e.port === port && (!toAddress || e.local === toAddress)),
    datagrams: () => target.events.filter((e) => e.ev === 'udp'),
    stop: cleanup,
  };
}

function spawnSyncQuiet(cmd: string, args: string[]): void {
  try {
    execFileSync(cmd, args, { stdio: 'ignore' });
  } catch {
    // already gone
  }
}

import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import net from 'node:net';
import { Readable } from 'node:stream';

/**
 * The host end of a microVM's control channel: one virtio-serial port (QEMU's chardev
 * socket `agentSocket`), multiplexed by channel number (guest/mux.c has the frame format).
 * It serves a unix socket (`initSocket`) on the host where every connection becomes one
 * channel to rollbox-init in the guest, so the init client (src/workers/init) speaks to a
 * microVM exactly as to a container. The guest writes only what its multiplexer relays
 * from the init: code in the guest has no way onto the port.
 */
export const MuxKind = {
  open: 1, data: 2, eof: 3, close: 4, ping: 5, pong: 6, restored: 7, snapshot: 8, policy: 9, freeze: 10, result: 11, net: 12, netDone: 13, identity: 14, identityDone: 15, time: 16, timeIs: 17,
} as const;
/** Requests to the guest's trusted side itself (guest/vminit.h), each on a channel of its own. */
export type VmRequestKind = typeof MuxKind.snapshot | typeof MuxKind.policy | typeof MuxKind.freeze;
const HEADER_BYTES = 12;
/** The guest multiplexer's limit on one frame's payload (MUX_MAX_PAYLOAD). */
export const MUX_MAX_PAYLOAD_BYTES = 64 * 1024;

/** A wall clock time as the guest's multiplexer reads it: u64 seconds, u32 nanoseconds. */
function wallClock(ms: number): Buffer {
  const out = Buffer.alloc(12);
  out.writeBigUInt64LE(BigInt(Math.floor(ms / 1000)), 0);
  out.writeUInt32LE((ms % 1000) * 1_000_000, 8);
  return out;
}

export function muxFrame(channel: number, kind: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const header = Buffer.alloc(HEADER_BYTES);
  header.writeUInt32LE(channel, 0);
  header[4] = kind;
  header.writeUInt32LE(payload.length, 8);
  return Buffer.concat([header, payload]);
}

export interface VmChannel {
  /** Where the init client connects (one connection per command). */
  readonly initSocket: string;
  /** Resolves once the guest's multiplexer answered a ping (the guest is up); rejects past `timeoutMs`. */
  ready(timeoutMs: number): Promise<void>;
  /**
   * First after a restore (before any command): the guest drops the channels of before the
   * save, sets its wall clock to the host's now and reseeds its RNG from fresh entropy (guest/mux.c).
   */
  restored(): void;
  /**
   * A request to the guest's multiplexer itself (a snapshot, hidden paths, a freeze), not
   * to the init: its body is sent whole, its answer comes as `data` (a snapshot's tar)
   * and then its result.
   */
  request(kind: VmRequestKind, body: Buffer): VmRequest;
  /**
   * After `restored`, for a VM with a NIC: the guest's multiplexer gives eth0 this address
   * (`a.b.c.d/N`) and default route, and its resolver this gateway, before any command;
   * rejects with what the guest reported, or past `timeoutMs`.
   */
  setNetwork(net: { address: string; gateway: string }, timeoutMs: number): Promise<void>;
  /**
   * Who the VM is, before any command: its hostname and (when given) its sandbox's pids
   * limit, set by the guest's multiplexer. At boot, and on a fork's child (whose memory,
   * hostname included, is its parent's). Rejects with what the guest reported, or past `timeoutMs`.
   */
  setIdentity(identity: { hostname: string; pids?: number }, timeoutMs: number): Promise<void>;
  /** The port's host end closed (the VMM exited). */
  readonly closed: Promise<void>;
  close(): Promise<void>;
}

export interface VmRequest {
  /**
   * The answer's bytes, ended when the result comes; destroyed with an error when the
   * channel ends without one (the guest's side died, the VM ended). While its reader lags,
   * the whole port waits (the guest then stops reading what it relays).
   */
  readonly data: Readable;
  /** The result's payload (guest/vminit.h MUX_RESULT); rejects when the channel ends without one. */
  readonly result: Promise<Buffer>;
  /** Drops the request (the guest kills a snapshot's child); safe to call twice or after the end. */
  cancel(): void;
}

interface PendingRequest {
  data: Readable;
  settle(result: Buffer | Error): void;
}

/** `a.b.c.d` as 4 bytes in network order. */
function ipv4Bytes(address: string): Buffer {
  const parts = address.split('.').map(Number);
  if (parts.length !== 4 || parts.some((n) => !Number.isInteger(n) || n < 0 || n > 255)) throw new Error(`not an IPv4 address: ${address}`);
  return Buffer.from(parts);
}

function connectAgent(agentSocket: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.createConnection(agentSocket);
    socket.once('connect', () => {
      socket.off('error', reject);
      resolve(socket);
    });
    socket.once('error', reject);
  });
}

/**
 * Connects to the VMM's port socket (retrying while QEMU creates it) and serves `initSocket`.
 * `vmmAlive` ends the wait early: a QEMU that exited never creates it, and one still starting
 * on a loaded host may take seconds to.
 */
export async function openVmChannel(agentSocket: string, initSocket: string, options: { connectTimeoutMs: number; vmmAlive?: () => boolean }): Promise<VmChannel> {
  const deadline = Date.now() + options.connectTimeoutMs;
  let port: net.Socket | undefined;
  for (;;) {
    try {
      port = await connectAgent(agentSocket);
      break;
    } catch (err) {
      const vmmGone = options.vmmAlive && !options.vmmAlive();
      if (vmmGone || Date.now() > deadline) throw new Error(`cannot reach the microVM's channel ${agentSocket}${vmmGone ? ' (its QEMU exited)' : ''}: ${(err as Error).message}`, { cause: err });
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  const agent = port;
  const conns = new Map<number, net.Socket>();
  const requests = new Map<number, PendingRequest>();
  /** Requests whose reader asked the port to wait. */
  const lagging = new Set<number>();
  const resumeFor = (id: number): void => {
    if (lagging.delete(id) && lagging.size === 0) agent.resume();
  };
  let nextChannel = 1;
  let pending: Buffer = Buffer.alloc(0);
  const pongWaiters = new Set<() => void>();
  /** Waiters for the guest's answers on channel 0 (NET_DONE, IDENTITY_DONE), one per kind at a time. */
  const controlDone = new Map<number, (status: number) => void>();
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => (resolveClosed = r));

  agent.on('data', (chunk: Buffer) => {
    pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
    let off = 0;
    while (pending.length - off >= HEADER_BYTES) {
      const len = pending.readUInt32LE(off + 8);
      if (len > MUX_MAX_PAYLOAD_BYTES) {
        // Not what the multiplexer sends: the channel is not to be trusted any more.
        agent.destroy(new Error(`oversized frame (${len} bytes) from the guest`));
        return;
      }
      if (pending.length - off < HEADER_BYTES + len) break;
      const id = pending.readUInt32LE(off);
      const kind = pending[off + 4]!;
      const payload = pending.subarray(off + HEADER_BYTES, off + HEADER_BYTES + len);
      off += HEADER_BYTES + len;
      if (kind === MuxKind.pong) {
        for (const w of pongWaiters) w();
        pongWaiters.clear();
        continue;
      }
      if (kind === MuxKind.time && id === 0 && len === 8) {
        // The guest setting its clock after a restore (guest/mux.c): its token back, and the time now.
        const nowMs = Date.now();
        agent.write(muxFrame(0, MuxKind.timeIs, Buffer.concat([payload, wallClock(nowMs)])));
        continue;
      }
      if ((kind === MuxKind.netDone || kind === MuxKind.identityDone) && id === 0) {
        controlDone.get(kind)?.(len >= 4 ? payload.readUInt32LE(0) : -1);
        continue;
      }
      const req = requests.get(id);
      if (req) {
        if (kind === MuxKind.data) {
          if (!req.data.push(Buffer.from(payload))) {
            lagging.add(id);
            agent.pause();
          }
        } else if (kind === MuxKind.result) req.settle(Buffer.from(payload));
        else if (kind === MuxKind.close) req.settle(new Error('the guest ended the request without a result'));
        continue;
      }
      const conn = conns.get(id);
      if (!conn) continue;
      if (kind === MuxKind.data) conn.write(Buffer.from(payload));
      else if (kind === MuxKind.eof) conn.end();
      else if (kind === MuxKind.close) {
        conns.delete(id);
        conn.destroy();
      }
    }
    pending = off === pending.length ? Buffer.alloc(0) : pending.subarray(off);
  });
  const endAll = (): void => {
    for (const conn of conns.values()) conn.destroy();
    conns.clear();
    for (const req of [...requests.values()]) req.settle(new Error('the microVM\'s channel closed'));
    resolveClosed();
  };
  agent.on('close', endAll);
  agent.on('error', () => {});

  await fs.rm(initSocket, { force: true });
  const server = net.createServer({ allowHalfOpen: true }, (conn) => {
    if (agent.destroyed) return conn.destroy();
    const id = nextChannel++;
    conns.set(id, conn);
    agent.write(muxFrame(id, MuxKind.open));
    conn.on('data', (data: Buffer) => {
      for (let o = 0; o < data.length; o += MUX_MAX_PAYLOAD_BYTES) {
        // Backpressure: while the port's buffer is full, this connection stops reading.
        if (!agent.write(muxFrame(id, MuxKind.data, data.subarray(o, o + MUX_MAX_PAYLOAD_BYTES)))) {
          conn.pause();
          agent.once('drain', () => conn.resume());
        }
      }
    });
    conn.on('end', () => {
      if (conns.get(id) === conn && !agent.destroyed) agent.write(muxFrame(id, MuxKind.eof));
    });
    conn.on('close', () => {
      if (conns.get(id) !== conn) return;
      conns.delete(id);
      if (!agent.destroyed) agent.write(muxFrame(id, MuxKind.close));
    });
    conn.on('error', () => {});
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(initSocket, () => resolve());
  });
  await fs.chmod(initSocket, 0o600);

  const request = (kind: VmRequestKind, body: Buffer): VmRequest => {
    const id = nextChannel++;
    let settleResult!: (r: Buffer | Error) => void;
    const result = new Promise<Buffer>((resolve, reject) => (settleResult = (r) => (r instanceof Error ? reject(r) : resolve(r))));
    result.catch(() => undefined); // the caller's to await
    const data = new Readable({
      read: () => resumeFor(id),
      destroy: (err, cb) => {
        resumeFor(id);
        cb(err);
      },
    });
    let done = false;
    const pending: PendingRequest = {
      data,
      settle(r) {
        if (done) return;
        done = true;
        requests.delete(id);
        resumeFor(id);
        settleResult(r);
        if (r instanceof Error) data.destroy(r);
        else data.push(null);
      },
    };
    if (agent.destroyed) pending.settle(new Error('the microVM\'s channel is closed'));
    else {
      requests.set(id, pending);
      agent.write(muxFrame(id, kind));
      for (let o = 0; o < body.length; o += MUX_MAX_PAYLOAD_BYTES) agent.write(muxFrame(id, MuxKind.data, body.subarray(o, o + MUX_MAX_PAYLOAD_BYTES)));
      agent.write(muxFrame(id, MuxKind.eof));
    }
    return {
      data,
      result,
      cancel() {
        if (done) return;
        if (!agent.destroyed) agent.write(muxFrame(id, MuxKind.close));
        pending.settle(new Error('cancelled'));
      },
    };
  };

  /** A frame on channel 0 that the guest answers with `doneKind` (u32 status) before anything else. */
  const control = (kind: number, payload: Buffer, doneKind: number, timeoutMs: number, what: string): Promise<number> =>
    new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the guest did not ${what} within ${timeoutMs} ms`)), timeoutMs);
      controlDone.set(doneKind, (status) => {
        clearTimeout(timer);
        resolve(status);
      });
      void closed.then(() => reject(new Error(`the microVM exited before it could ${what}`)));
      agent.write(muxFrame(0, kind, payload));
    }).finally(() => controlDone.delete(doneKind));

  return {
    initSocket,
    closed,
    request,
    async ready(timeoutMs) {
      const until = Date.now() + timeoutMs;
      // Pings until one is answered: the guest's multiplexer reads the port only once it runs.
      while (Date.now() < until) {
        if (agent.destroyed) throw new Error('the microVM exited before its init came up');
        const answered = new Promise<boolean>((resolve) => {
          const w = (): void => resolve(true);
          pongWaiters.add(w);
          setTimeout(() => {
            pongWaiters.delete(w);
            resolve(false);
          }, 200);
        });
        agent.write(muxFrame(0, MuxKind.ping));
        if (await answered) return;
      }
      throw new Error(`the microVM's init did not come up within ${timeoutMs} ms`);
    },
    restored() {
      agent.write(muxFrame(0, MuxKind.restored, Buffer.concat([wallClock(Date.now()), randomBytes(32)])));
    },
    async setNetwork(net, timeoutMs) {
      const [address, prefix] = net.address.split('/');
      const payload = Buffer.alloc(12);
      ipv4Bytes(address!).copy(payload, 0);
      payload[4] = Number(prefix);
      ipv4Bytes(net.gateway).copy(payload, 8);
      const status = await control(MuxKind.net, payload, MuxKind.netDone, timeoutMs, 'take its new network');
      if (status !== 0) throw new Error(`the guest could not take its new network ${net.address} via ${net.gateway} (errno ${status})`);
    },
    async setIdentity(identity, timeoutMs) {
      const name = Buffer.from(identity.hostname, 'utf8');
      if (name.length < 1 || name.length > 64 || name.includes(0)) throw new Error(`not a hostname: ${identity.hostname}`);
      const pids = Buffer.alloc(4);
      pids.writeUInt32LE(identity.pids ?? 0, 0);
      const status = await control(MuxKind.identity, Buffer.concat([pids, name]), MuxKind.identityDone, timeoutMs, 'take its identity');
      if (status !== 0) throw new Error(`the guest could not take its identity ${identity.hostname} (errno ${status})`);
    },
    async close() {
      // The server's close waits for its connections: they end first (a command's may be open still).
      const closing = new Promise<void>((resolve) => server.close(() => resolve()));
      agent.destroy();
      endAll();
      await closing;
      await fs.rm(initSocket, { force: true });
    },
  };
}

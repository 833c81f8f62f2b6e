import { spawn } from 'node:child_process';
import { closeSync, mkdirSync, openSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError } from '../../api/index.ts';
import { DEFAULT_GATE_BINARY } from '../mounts.ts';
import { GATE_PROTOCOL_VERSION, GateDecoder, encode, type FromGate } from './protocol.ts';

export type GateHello = Extract<FromGate, { type: 'hello' }>;
export type GateBlob = Extract<FromGate, { type: 'listed' }>['blobs'][number];

export interface GateClientDeps {
  /** The gate's directory (its sockets, lock and log). */
  dir: string;
  gateBinary?: string;
  /** How long the gate holds reads while no fetcher is connected, before answering EIO. */
  graceMs: number;
  /** How long one read may wait for its chunks at most, fetcher connected or not. */
  eventTimeoutMs: number;
  /** The gate asks for chunks (a read is waiting on them). */
  onNeed: (id: string, first: number, count: number) => void;
  /** The connection is gone (the gate died, or it was closed). */
  onLost: (err: Error) => void;
}

const CONNECT_TIMEOUT_MS = 5000;
const UNIX_PATH_MAX = 107;

/**
 * The worker's connection to its host's rollbox-gate. The gate is a detached process that
 * outlives the worker (as the sandboxes' inits do): `connect` reaches the running one, or
 * starts one (which takes over from a keeper a dead gate left, see rollbox-gate.c).
 */
export class GateClient {
  private socket: net.Socket | undefined;
  private decoder = new GateDecoder();
  private readonly waiting = new Map<string, { resolve: (m: FromGate) => void; reject: (e: Error) => void }[]>();
  private readonly inOrder: { type: 'listed' | 'busy'; resolve: (m: FromGate) => void; reject: (e: Error) => void }[] = [];
  private helloWaiter: { resolve: (m: GateHello) => void; reject: (e: Error) => void } | undefined;
  /** Closed on purpose (close, shutdown): not reported as lost. */
  private closing = false;
  hello: GateHello | undefined;

  constructor(private readonly deps: GateClientDeps) {
    if (path.join(deps.dir, 'keeper.sock').length > UNIX_PATH_MAX) throw new RollboxError('internal', `${deps.dir}: too long for the gate's unix sockets (a shorter data dir is needed)`);
  }

  get connected(): boolean {
    return this.socket !== undefined;
  }

  /** Connects to the host's gate, starting one if none runs. */
  async connect(): Promise<GateHello> {
    if (this.socket && this.hello) return this.hello;
    this.closing = false;
    mkdirSync(this.deps.dir, { recursive: true, mode: 0o700 });
    const sockPath = path.join(this.deps.dir, 'gate.sock');
    let started = false;
    const deadline = Date.now() + CONNECT_TIMEOUT_MS;
    for (let delayMs = 5; ; delayMs = Math.min(delayMs * 2, 100)) {
      const socket = await tryConnect(sockPath);
      if (socket) return this.adopt(socket);
      if (!started) {
        this.startGate();
        started = true;
      }
      if (Date.now() > deadline) throw new RollboxError('internal', `the lazy layers' gate did not start (see ${path.join(this.deps.dir, 'gate.log')})`);
      await sleep(delayMs);
    }
  }

  private startGate(): void {
    const log = openSync(path.join(this.deps.dir, 'gate.log'), 'a');
    try {
      const child = spawn(this.deps.gateBinary ?? DEFAULT_GATE_BINARY, ['serve', this.deps.dir, String(this.deps.graceMs), String(this.deps.eventTimeoutMs)], { detached: true, stdio: ['ignore', log, log] });
      child.on('error', () => undefined); // reported as the connect timeout, with the log to read
      child.unref();
    } finally {
      closeSync(log);
    }
  }

  private adopt(socket: net.Socket): Promise<GateHello> {
    this.socket = socket;
    this.decoder = new GateDecoder();
    socket.on('data', (chunk: Buffer) => {
      for (const m of this.decoder.push(chunk)) this.dispatch(m);
    });
    const lost = (err?: Error): void => {
      if (this.socket !== socket) return;
      this.socket = undefined;
      this.hello = undefined;
      const e = err ?? new Error('the gate closed its connection');
      this.helloWaiter?.reject(e);
      this.helloWaiter = undefined;
      for (const list of this.waiting.values()) for (const w of list) w.reject(e);
      this.waiting.clear();
      for (const w of this.inOrder.splice(0)) w.reject(e);
      if (!this.closing) this.deps.onLost(e);
    };
    socket.on('error', (err) => lost(err));
    socket.on('close', () => lost());
    return new Promise<GateHello>((resolve, reject) => {
      this.helloWaiter = { resolve, reject };
    });
  }

  private dispatch(m: FromGate): void {
    switch (m.type) {
      case 'hello':
        if (m.version !== GATE_PROTOCOL_VERSION) {
          this.helloWaiter?.reject(new RollboxError('internal', `the running gate speaks protocol ${m.version}, this worker ${GATE_PROTOCOL_VERSION}`));
          this.socket?.destroy();
          return;
        }
        this.hello = m;
        this.helloWaiter?.resolve(m);
        this.helloWaiter = undefined;
        return;
      case 'need':
        this.deps.onNeed(m.id, m.first, m.count);
        return;
      case 'attached':
      case 'detached':
        return this.settle(`${m.type}:${m.id}`, m);
      case 'written':
        return this.settle(`written:${m.id}:${m.chunk}`, m);
      case 'listed':
      case 'busy': {
        const i = this.inOrder.findIndex((w) => w.type === m.type);
        if (i >= 0) this.inOrder.splice(i, 1)[0]!.resolve(m);
        return;
      }
    }
  }

  private settle(key: string, m: FromGate): void {
    const list = this.waiting.get(key);
    const w = list?.shift();
    if (list && list.length === 0) this.waiting.delete(key);
    w?.resolve(m);
  }

  private request<T extends FromGate>(key: string, bytes: Buffer | Buffer[]): Promise<T> {
    const socket = this.socket;
    if (!socket) return Promise.reject(new RollboxError('internal', 'not connected to the gate'));
    return new Promise<T>((resolve, reject) => {
      const list = this.waiting.get(key) ?? [];
      list.push({ resolve: resolve as (m: FromGate) => void, reject });
      this.waiting.set(key, list);
      for (const b of Array.isArray(bytes) ? bytes : [bytes]) socket.write(b);
    });
  }

  private inOrderRequest<T extends FromGate>(type: 'listed' | 'busy', bytes: Buffer): Promise<T> {
    const socket = this.socket;
    if (!socket) return Promise.reject(new RollboxError('internal', 'not connected to the gate'));
    return new Promise<T>((resolve, reject) => {
      this.inOrder.push({ type, resolve: resolve as (m: FromGate) => void, reject });
      socket.write(bytes);
    });
  }

  /** The gate opens the blob, then marks it (unless it is complete): returns the chunks it holds. */
  async attach(id: string, sizeBytes: number, chunkSizeBytes: number, dataPath: string, mapPath: string): Promise<{ present: number; total: number }> {
    const r = await this.request<Extract<FromGate, { type: 'attached' }>>(`attached:${id}`, encode.attach(id, sizeBytes, chunkSizeBytes, dataPath, mapPath));
    if (r.errno) throw new RollboxError('internal', `the gate could not take blob ${id.slice(0, 12)} (errno ${r.errno})`);
    return { present: r.present, total: r.total };
  }

  async detach(id: string): Promise<void> {
    await this.request(`detached:${id}`, encode.detach(id));
  }

  /** One chunk's verified bytes: resolves once the gate wrote and synced them. */
  async data(id: string, chunk: number, bytes: Buffer): Promise<void> {
    const r = await this.request<Extract<FromGate, { type: 'written' }>>(`written:${id}:${chunk}`, [encode.dataHead(id, chunk, bytes.length), bytes]);
    if (r.errno) throw new RollboxError('internal', `the gate could not write chunk ${chunk} of ${id.slice(0, 12)} (errno ${r.errno})`);
  }

  /** The fetch of these chunks failed: the reads waiting on them get EIO. */
  fail(id: string, first: number, count: number, errno = 5): void {
    this.socket?.write(encode.fail(id, first, count, errno));
  }

  async list(): Promise<GateBlob[]> {
    return (await this.inOrderRequest<Extract<FromGate, { type: 'listed' }>>('listed', encode.list())).blobs;
  }

  /** Ends the gate (and its keeper) if it holds no blob; false when it still does. */
  async shutdown(): Promise<boolean> {
    const socket = this.socket;
    if (!socket) return true;
    this.closing = true;
    const closed = new Promise<boolean>((resolve) => socket.once('close', () => resolve(true)));
    const busy = this.inOrderRequest<Extract<FromGate, { type: 'busy' }>>('busy', encode.shutdown()).then(() => false, () => true);
    const exited = await Promise.race([closed, busy]);
    if (!exited) this.closing = false;
    return exited;
  }

  /** Closes this worker's connection; the gate stays (and holds reads for its grace). */
  close(): void {
    this.closing = true;
    this.socket?.destroy();
  }
}

function tryConnect(sockPath: string): Promise<net.Socket | undefined> {
  return new Promise((resolve) => {
    const socket = net.createConnection(sockPath);
    socket.once('connect', () => {
      socket.removeAllListeners('error');
      resolve(socket);
    });
    socket.once('error', () => resolve(undefined));
  });
}

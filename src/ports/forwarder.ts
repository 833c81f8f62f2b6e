import { spawn, type ChildProcess } from 'node:child_process';
import dns from 'node:dns/promises';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { RollboxError } from '../api/index.ts';

/** Built from src/ports/rollbox-portfwd.c by scripts/build-portfwd.sh. */
export const DEFAULT_PORTFWD_BINARY = path.resolve(import.meta.dirname, '../../build/rollbox-portfwd');
/** The helper's start and its answer to one connection (it connects on loopback: refused or taken at once). */
const HELPER_START_TIMEOUT_MS = 5000;
const ANSWER_TIMEOUT_MS = 10_000;
/** A relay helper that died is started again after this long (on the port it had), twice as long after each start that failed, up to the max. */
const HELPER_RESTART_MS = 200;
const HELPER_RESTART_MAX_MS = 5000;
const MAX_ANSWER_BYTES = 512;

/** The running helper, and the port its relay listens on (0 without one). */
type Helper = ChildProcess & { relayPort: number };

/**
 * Connections to TCP ports inside sandboxes' network namespaces (a sandbox without a
 * network has only its loopback: nothing on the host can reach it by address). Node
 * cannot make a socket in another namespace, so one small helper process per worker
 * (rollbox-portfwd) does: it listens on a unix socket in the worker's own directory, and
 * forks per connection into the sandbox's namespace; the socket `open` answers is a plain
 * byte stream to the port. With `listenRelay` the same helper is also the worker's port
 * relay (relay.ts), started at once and again whenever it dies (on the port it had);
 * otherwise it is started on first use and again by the next use after it died.
 */
export class PortForwarder {
  private helper: Promise<Helper> | undefined;
  private child: ChildProcess | undefined;
  /** The relay's arguments (address, port, control socket) once `listenRelay` was called. */
  private relay: [string, string, string] | undefined;
  private stopped = false;
  private restartMs = HELPER_RESTART_MS;
  readonly socketPath: string;

  constructor(
    private readonly options: { dir: string; binary?: string; logger?: Pick<Logger, 'warn'> },
  ) {
    this.socketPath = path.join(options.dir, 'portfwd.sock');
  }

  /** A connection to `port` on the loopback of the network namespace of process `netnsPid` (a sandbox's init). */
  async open(netnsPid: number, port: number): Promise<net.Socket> {
    await this.ensureHelper();
    const socket = net.connect({ path: this.socketPath, allowHalfOpen: true });
    try {
      await new Promise<void>((resolve, reject) => {
        socket.once('connect', resolve);
        socket.once('error', reject);
      });
      socket.write(`${netnsPid} ${port}\n`);
      const answer = await readLine(socket, ANSWER_TIMEOUT_MS, MAX_ANSWER_BYTES);
      // readLine left it paused: flowing again for whoever reads it next (in this tick: nothing is lost).
      if (answer === 'ok') return socket.resume();
      // "err ECODE message": nothing listens there (ECONNREFUSED), the sandbox's network is gone (ENOENT)...
      throw new Error(answer.startsWith('err ') ? answer.slice(4) : `unexpected answer from rollbox-portfwd: ${answer}`);
    } catch (err) {
      socket.destroy();
      throw err;
    }
  }

  /**
   * Makes the helper the port relay too: it listens on TCP at `host:port` (port 0: any free
   * one) and asks on `controlPath` whether each connection's ticket opens a port. Answers
   * the port it listens on.
   */
  async listenRelay(host: string, port: number, controlPath: string): Promise<number> {
    if (this.helper) throw new Error('listenRelay must come before the helper is started');
    const address = net.isIP(host) ? host : (await dns.lookup(host)).address;
    this.relay = [address, String(port), controlPath];
    const { relayPort } = await this.ensureHelper();
    // A helper started again takes the same port: gateways know it from the heartbeat.
    this.relay[1] = String(relayPort);
    return relayPort;
  }

  stop(): void {
    this.stopped = true;
    const helper = this.helper;
    this.helper = undefined;
    this.child = undefined;
    void helper?.then((child) => child.kill('SIGKILL'), () => undefined);
  }

  private ensureHelper(): Promise<Helper> {
    this.helper ??= this.startHelper().catch((err: unknown) => {
      this.helper = undefined;
      throw err;
    });
    return this.helper;
  }

  private async startHelper(): Promise<Helper> {
    await fs.mkdir(this.options.dir, { recursive: true, mode: 0o700 });
    const binary = this.options.binary ?? DEFAULT_PORTFWD_BINARY;
    const child = spawn(binary, [this.socketPath, ...(this.relay ?? [])], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-2000)));
    this.child = child;
    child.once('exit', (code, signal) => {
      if (this.child !== child) return;
      this.child = undefined;
      this.helper = undefined;
      if (!this.relay || this.stopped) return;
      // The relay is a door gateways dial at any time: it opens again at once.
      this.options.logger?.warn({ code, signal, stderr: stderr.trim() }, 'the port relay helper (rollbox-portfwd) exited; starting it again');
      const again = () => {
        if (!this.stopped) void this.ensureHelper().catch((err: unknown) => this.options.logger?.warn({ err }, 'the port relay helper did not start again'));
      };
      setTimeout(again, this.restartMs).unref();
      this.restartMs = Math.min(this.restartMs * 2, HELPER_RESTART_MAX_MS);
    });
    let relayPort: number;
    try {
      const ready = await Promise.race([
        readLine(child.stdout!, HELPER_START_TIMEOUT_MS, 64),
        new Promise<never>((_, reject) => child.once('error', reject)),
      ]);
      const m = /^ready (\d+)$/.exec(ready);
      if (!m) throw new Error(`said ${ready}`);
      relayPort = Number(m[1]);
      this.restartMs = HELPER_RESTART_MS;
    } catch (err) {
      child.kill('SIGKILL');
      throw new RollboxError('internal', `rollbox-portfwd did not start: ${stderr.trim() || (err instanceof Error ? err.message : String(err))} (build it with scripts/build-portfwd.sh)`);
    }
    child.stdout!.resume();
    // It must not keep the worker's process alive (it dies with it: PR_SET_PDEATHSIG).
    for (const pipe of [child.stdout, child.stderr] as net.Socket[]) pipe.unref();
    child.unref();
    return Object.assign(child, { relayPort });
  }
}

/**
 * One line from a stream, without taking anything past it (what follows is the payload:
 * it is put back). Bounded in bytes and time. The stream is left paused.
 */
export function readLine(stream: NodeJS.ReadableStream & { unshift(chunk: Buffer): void }, timeoutMs: number, maxBytes: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let held = Buffer.alloc(0);
    const done = (err: Error | undefined, line?: string) => {
      clearTimeout(timer);
      stream.off('data', onData);
      stream.off('end', onEnd);
      stream.off('error', onError);
      stream.pause();
      if (err) reject(err);
      else resolve(line!);
    };
    const onData = (chunk: Buffer) => {
      held = Buffer.concat([held, chunk]);
      const newline = held.indexOf(10);
      if (newline >= 0) {
        const rest = held.subarray(newline + 1);
        done(undefined, held.subarray(0, newline).toString('utf8'));
        if (rest.length) stream.unshift(rest);
      } else if (held.length > maxBytes) done(new Error(`line longer than ${maxBytes} bytes`));
    };
    const onEnd = () => done(new Error('the stream ended before its first line'));
    const onError = (err: Error) => done(err);
    const timer = setTimeout(() => done(new Error(`no line within ${timeoutMs} ms`)), timeoutMs);
    stream.on('data', onData);
    stream.once('end', onEnd);
    stream.once('error', onError);
  });
}

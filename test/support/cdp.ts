import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import type { Duplex } from 'node:stream';
import os from 'node:os';
import path from 'node:path';

/**
 * Headless Chromium driven over the Chrome DevTools Protocol, with nothing but Node:
 * Node 20 has no WebSocket client (`typeof WebSocket` is undefined without a flag), so
 * this holds the little of RFC 6455 CDP needs: the upgrade, masked client frames, and
 * reading (possibly fragmented) server frames.
 */

const WS_GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

/** A client frame (FIN set, masked as RFC 6455 requires of clients). */
function encodeFrame(opcode: number, payload: Buffer): Buffer {
  const len = payload.length;
  const header = Buffer.alloc(len < 126 ? 2 : len < 65_536 ? 4 : 10);
  header[0] = 0x80 | opcode;
  if (len < 126) header[1] = 0x80 | len;
  else if (len < 65_536) {
    header[1] = 0x80 | 126;
    header.writeUInt16BE(len, 2);
  } else {
    header[1] = 0x80 | 127;
    header.writeBigUInt64BE(BigInt(len), 2);
  }
  const mask = randomBytes(4);
  const masked = Buffer.alloc(len);
  for (let i = 0; i < len; i++) masked[i] = payload[i]! ^ mask[i & 3]!;
  return Buffer.concat([header, mask, masked]);
}

type Listener = (params: any, sessionId?: string) => void;

/** One WebSocket to a DevTools endpoint; commands carry a sessionId to reach a page. */
export class CdpConnection {
  private buffered: Buffer = Buffer.alloc(0);
  private fragments: Buffer[] = [];
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: any) => void; reject: (e: Error) => void; method: string }>();
  private readonly listeners = new Map<string, Set<Listener>>();
  private closed = false;

  private constructor(private readonly socket: Duplex) {
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('close', () => this.fail(new Error('DevTools connection closed')));
    socket.on('error', (err) => this.fail(err));
  }

  static connect(wsUrl: string): Promise<CdpConnection> {
    const url = new URL(wsUrl);
    const key = randomBytes(16).toString('base64');
    return new Promise((resolve, reject) => {
      const req = http.request({
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        headers: { connection: 'Upgrade', upgrade: 'websocket', 'sec-websocket-key': key, 'sec-websocket-version': '13' },
      });
      req.on('upgrade', (res, socket, head) => {
        const accept = createHash('sha1').update(key + WS_GUID).digest('base64');
        if (res.headers['sec-websocket-accept'] !== accept) {
          socket.destroy();
          return reject(new Error('DevTools answered the upgrade with a wrong Sec-WebSocket-Accept'));
        }
        const connection = new CdpConnection(socket);
        if (head.length) connection.onData(head);
        resolve(connection);
      });
      req.on('response', (res) => reject(new Error(`DevTools refused the upgrade: ${res.statusCode}`)));
      req.on('error', reject);
      req.end();
    });
  }

  send<T = any>(method: string, params: object = {}, sessionId?: string): Promise<T> {
    if (this.closed) return Promise.reject(new Error(`${method}: DevTools connection closed`));
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.socket.write(encodeFrame(0x1, Buffer.from(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }))));
    });
  }

  on(event: string, listener: Listener): () => void {
    const set = this.listeners.get(event) ?? new Set<Listener>();
    set.add(listener);
    this.listeners.set(event, set);
    return () => void set.delete(listener);
  }

  /** The next event of this name (for this session) that `match` accepts. */
  waitForEvent(event: string, sessionId?: string, match: (params: any) => boolean = () => true, timeoutMs = 30_000): Promise<any> {
    return new Promise((resolve, reject) => {
      const timeout = setTimeout(() => {
        off();
        reject(new Error(`timed out waiting for ${event}`));
      }, timeoutMs);
      const off = this.on(event, (params, sid) => {
        if ((sessionId && sid !== sessionId) || !match(params)) return;
        clearTimeout(timeout);
        off();
        resolve(params);
      });
    });
  }

  close(): void {
    if (this.closed) return;
    this.socket.end(encodeFrame(0x8, Buffer.alloc(0)));
    this.fail(new Error('DevTools connection closed'));
  }

  private fail(err: Error): void {
    this.closed = true;
    for (const [, p] of this.pending) p.reject(new Error(`${p.method}: ${err.message}`));
    this.pending.clear();
  }

  private onData(chunk: Buffer): void {
    this.buffered = this.buffered.length ? Buffer.concat([this.buffered, chunk]) : chunk;
    for (;;) {
      const buf = this.buffered;
      if (buf.length < 2) return;
      const fin = (buf[0]! & 0x80) !== 0;
      const opcode = buf[0]! & 0x0f;
      const masked = (buf[1]! & 0x80) !== 0;
      let len = buf[1]! & 0x7f;
      let offset = 2;
      if (len === 126) {
        if (buf.length < 4) return;
        len = buf.readUInt16BE(2);
        offset = 4;
      } else if (len === 127) {
        if (buf.length < 10) return;
        len = Number(buf.readBigUInt64BE(2));
        offset = 10;
      }
      const maskKey = masked ? buf.subarray(offset, offset + 4) : undefined;
      if (masked) offset += 4;
      if (buf.length < offset + len) return;
      const payload = Buffer.from(buf.subarray(offset, offset + len));
      if (maskKey) for (let i = 0; i < payload.length; i++) payload[i] = payload[i]! ^ maskKey[i & 3]!;
      this.buffered = buf.subarray(offset + len);
      this.onFrame(fin, opcode, payload);
    }
  }

  private onFrame(fin: boolean, opcode: number, payload: Buffer): void {
    if (opcode === 0x8) return this.close();
    if (opcode === 0x9) return void this.socket.write(encodeFrame(0xa, payload));
    if (opcode === 0xa) return;
    this.fragments.push(payload);
    if (!fin) return;
    const message = JSON.parse(Buffer.concat(this.fragments).toString('utf8'));
    this.fragments = [];
    if (typeof message.id === 'number') {
      const p = this.pending.get(message.id);
      this.pending.delete(message.id);
      if (message.error) p?.reject(new Error(`${p.method}: ${message.error.message}`));
      else p?.resolve(message.result);
      return;
    }
    for (const listener of this.listeners.get(message.method) ?? []) listener(message.params, message.sessionId);
  }
}

/** A tab: commands go to its session; what it shows is read with `evaluate`. */
export class CdpPage {
  /** JavaScript dialogs (alert, confirm) the page opened; each is answered with `acceptDialogs`. */
  readonly dialogs: { type: string; message: string }[] = [];
  /** Uncaught exceptions on the page. */
  readonly exceptions: string[] = [];
  acceptDialogs = true;

  constructor(readonly cdp: CdpConnection, readonly sessionId: string) {
    cdp.on('Page.javascriptDialogOpening', (params, sid) => {
      if (sid !== sessionId) return;
      this.dialogs.push({ type: params.type, message: params.message });
      this.send('Page.handleJavaScriptDialog', { accept: this.acceptDialogs }).catch(() => undefined);
    });
    cdp.on('Runtime.exceptionThrown', (params, sid) => {
      if (sid === sessionId) this.exceptions.push(params.exceptionDetails?.exception?.description ?? params.exceptionDetails?.text ?? 'exception');
    });
  }

  send<T = any>(method: string, params: object = {}): Promise<T> {
    return this.cdp.send<T>(method, params, this.sessionId);
  }

  async navigate(url: string): Promise<void> {
    const loaded = this.cdp.waitForEvent('Page.loadEventFired', this.sessionId);
    const { errorText } = await this.send<{ errorText?: string }>('Page.navigate', { url });
    if (errorText) throw new Error(`navigating to ${url}: ${errorText}`);
    await loaded;
  }

  /** The value of an expression in the page (awaited if a promise), or its exception thrown here. */
  async evaluate<T = any>(expression: string): Promise<T> {
    const r = await this.send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
    if (r.exceptionDetails) throw new Error(`evaluate: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
    return r.result.value as T;
  }

  /** Polls an expression until it is truthy; resolves with its value. */
  async waitFor<T = any>(what: string, expression: string, timeoutMs = 30_000): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const value = await this.evaluate<T>(expression);
      if (value) return value;
      if (Date.now() > deadline) throw new Error(`timed out waiting for the page to show ${what}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** A real mouse click at the middle of the first element matching `selector`. */
  async click(selector: string): Promise<void> {
    const box = await this.evaluate<{ x: number; y: number } | null>(`(() => {
      const e = document.querySelector(${JSON.stringify(selector)});
      if (!e) return null;
      e.scrollIntoView({ block: 'center' });
      const r = e.getBoundingClientRect();
      return { x: r.left + r.width / 2, y: r.top + r.height / 2 };
    })()`);
    if (!box) throw new Error(`nothing on the page matches ${selector}`);
    for (const type of ['mouseMoved', 'mousePressed', 'mouseReleased']) {
      await this.send('Input.dispatchMouseEvent', { type, x: box.x, y: box.y, button: 'left', clickCount: type === 'mouseMoved' ? 0 : 1 });
    }
  }

  /** The whole page (up to 4000 CSS pixels tall) as a PNG. */
  async screenshot(file: string): Promise<Buffer> {
    const { cssContentSize } = await this.send('Page.getLayoutMetrics');
    const clip = { x: 0, y: 0, width: Math.ceil(cssContentSize.width), height: Math.min(4000, Math.ceil(cssContentSize.height)), scale: 1 };
    const { data } = await this.send<{ data: string }>('Page.captureScreenshot', { format: 'png', captureBeyondViewport: true, clip });
    const png = Buffer.from(data, 'base64');
    await fs.mkdir(path.dirname(file), { recursive: true });
    await fs.writeFile(file, png);
    return png;
  }
}

export interface Chromium {
  pid: number;
  cdp: CdpConnection;
  newPage(viewport?: { width: number; height: number }): Promise<CdpPage>;
  /** Ends the browser by its pid (SIGTERM, then SIGKILL) and removes its profile dir. */
  close(): Promise<void>;
}

/** Starts headless Chromium on a DevTools port of its choosing, with a throwaway profile. */
export async function launchChromium(binary = '/usr/bin/chromium'): Promise<Chromium> {
  const profileDir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-chromium-'));
  const args = ['--headless=new', '--no-sandbox', '--disable-gpu', '--remote-debugging-port=0', `--user-data-dir=${profileDir}`, '--no-first-run', '--disable-extensions', '--disable-background-networking', '--disable-dev-shm-usage', '--hide-scrollbars', '--mute-audio', 'about:blank'];
  const child: ChildProcess = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      process.kill(child.pid, 'SIGTERM');
      const gone = await Promise.race([exited.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 5000))]);
      if (!gone) {
        process.kill(child.pid, 'SIGKILL');
        await exited;
      }
    }
    await fs.rm(profileDir, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 });
  };
  let log = '';
  try {
    const wsUrl = await new Promise<string>((resolve, reject) => {
      // 60 s: under a full CI run (two files at once on two cores) a start once took over 30 s.
      const timeout = setTimeout(() => reject(new Error(`chromium did not say where DevTools listens: ${log.slice(-2000)}`)), 60_000);
      child.once('error', reject);
      child.once('exit', (code, signal) => reject(new Error(`chromium exited (${code ?? signal}) before DevTools listened: ${log.slice(-2000)}`)));
      // Its stderr is drained for as long as it runs; the last bit is kept for errors.
      child.stderr!.on('data', (d: Buffer) => {
        log = (log + d.toString()).slice(-8000);
        const m = /DevTools listening on (ws:\/\/\S+)/.exec(log);
        if (m) {
          clearTimeout(timeout);
          resolve(m[1]!);
        }
      });
    });
    const cdp = await CdpConnection.connect(wsUrl);
    return {
      pid: child.pid!,
      cdp,
      async newPage(viewport = { width: 1280, height: 900 }) {
        const { targetId } = await cdp.send('Target.createTarget', { url: 'about:blank' });
        const { sessionId } = await cdp.send('Target.attachToTarget', { targetId, flatten: true });
        const page = new CdpPage(cdp, sessionId);
        await page.send('Page.enable');
        await page.send('Runtime.enable');
        await page.send('Emulation.setDeviceMetricsOverride', { ...viewport, deviceScaleFactor: 1, mobile: false });
        return page;
      },
      async close() {
        cdp.close();
        await stop();
      },
    };
  } catch (err) {
    await stop();
    throw err;
  }
}

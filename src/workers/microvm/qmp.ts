import net from 'node:net';

/** A QMP connection's commands: each answers its `return`; a QMP `error` rejects. */
export interface QmpSession {
  command(execute: string, args?: Record<string, unknown>): Promise<unknown>;
}

/**
 * A session on a VM's monitor socket (QEMU's JSON machine protocol): the greeting and
 * `qmp_capabilities`, then `use` sends its commands one at a time on that connection.
 * A closed socket or the timeout (for the whole session) rejects. Events are skipped.
 */
export function withQmp<T>(socketPath: string, use: (session: QmpSession) => Promise<T>, timeoutMs = 5000): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const socket = net.connect(socketPath);
    let buffered = '';
    let pending: { execute: string; resolve: (value: unknown) => void } | undefined;
    let greeted: (() => void) | undefined;
    let done = false;
    const timer = setTimeout(() => finish(new Error(`QMP on ${socketPath}: no end in ${timeoutMs} ms${pending ? ` (waiting for ${pending.execute})` : ''}`)), timeoutMs);
    const finish = (err: Error | undefined, value?: T): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      if (err) reject(err);
      else resolve(value as T);
    };
    const send = (execute: string, args?: Record<string, unknown>): Promise<unknown> =>
      new Promise((resolveCommand) => {
        pending = { execute, resolve: resolveCommand };
        socket.write(`${JSON.stringify({ execute, ...(args ? { arguments: args } : {}) })}\n`);
      });
    socket.on('error', (err) => finish(new Error(`QMP on ${socketPath}: ${err.message}`)));
    socket.on('close', () => finish(new Error(`QMP on ${socketPath}: the monitor closed${pending ? ` (waiting for ${pending.execute})` : ''}`)));
    socket.on('data', (data) => {
      buffered += data.toString('utf8');
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const line = buffered.slice(0, nl).trim();
        buffered = buffered.slice(nl + 1);
        if (!line) continue;
        const msg = JSON.parse(line) as { QMP?: unknown; event?: string; return?: unknown; error?: { class: string; desc: string } };
        if (msg.event) continue;
        if (msg.QMP) {
          greeted?.();
          continue;
        }
        const answered = pending;
        pending = undefined;
        if (msg.error) return finish(new Error(`QMP ${answered?.execute ?? '?'}: ${msg.error.class}: ${msg.error.desc}`));
        answered?.resolve(msg.return);
      }
    });
    void new Promise<void>((r) => (greeted = r))
      .then(() => send('qmp_capabilities'))
      .then(() => use({ command: send }))
      .then(
        (value) => finish(undefined, value),
        (err: Error) => finish(err),
      );
  });
}

/** One command in a session of its own. */
export function qmpCommand(socketPath: string, execute: string, args?: Record<string, unknown>, timeoutMs?: number): Promise<unknown> {
  return withQmp(socketPath, (qmp) => qmp.command(execute, args), timeoutMs);
}

/** Polls `query-migrate` until the migration (either way) ends; a failed one rejects with QEMU's reason. */
export async function migrationEnded(qmp: QmpSession, pollMs = 10): Promise<void> {
  for (;;) {
    const info = (await qmp.command('query-migrate')) as { status?: string; 'error-desc'?: string };
    if (info.status === 'completed') return;
    if (info.status === 'failed' || info.status === 'cancelled') throw new Error(`migration ${info.status}: ${info['error-desc'] ?? 'no reason given'}`);
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

/**
 * Until QEMU listens on its monitor `socketPath`: it makes the channel's socket before its
 * monitors', so a VM whose channel answers may not take QMP yet (seen with 8 restores at once).
 */
export async function monitorReady(socketPath: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const connected = await new Promise<boolean>((resolve) => {
      const socket = net.connect(socketPath);
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (connected) return;
    if (Date.now() > deadline) throw new Error(`QEMU's monitor ${socketPath} did not come up within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

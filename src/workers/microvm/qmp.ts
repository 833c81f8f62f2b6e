import net from 'node:net';

/**
 * One QMP command on a VM's monitor socket (QEMU's JSON machine protocol): the greeting,
 * `qmp_capabilities`, then `execute`. Answers the command's `return`; a QMP `error`, a
 * closed socket or the timeout rejects. Events QEMU sends meanwhile are skipped.
 */
export function qmpCommand(socketPath: string, execute: string, timeoutMs = 5000): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(socketPath);
    let buffered = '';
    let step: 'greeting' | 'capabilities' | 'command' = 'greeting';
    const timer = setTimeout(() => finish(new Error(`QMP ${execute}: no answer in ${timeoutMs} ms`)), timeoutMs);
    const finish = (err: Error | undefined, value?: unknown): void => {
      clearTimeout(timer);
      socket.destroy();
      if (err) reject(err);
      else resolve(value);
    };
    const send = (cmd: string): void => void socket.write(`${JSON.stringify({ execute: cmd })}\n`);
    socket.on('error', (err) => finish(new Error(`QMP ${execute}: ${err.message}`)));
    socket.on('close', () => finish(new Error(`QMP ${execute}: the monitor closed`)));
    socket.on('data', (data) => {
      buffered += data.toString('utf8');
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const line = buffered.slice(0, nl).trim();
        buffered = buffered.slice(nl + 1);
        if (!line) continue;
        const msg = JSON.parse(line) as { QMP?: unknown; event?: string; return?: unknown; error?: { class: string; desc: string } };
        if (msg.event) continue;
        if (msg.error) return finish(new Error(`QMP ${step === 'command' ? execute : 'qmp_capabilities'}: ${msg.error.class}: ${msg.error.desc}`));
        if (step === 'greeting' && msg.QMP) {
          step = 'capabilities';
          send('qmp_capabilities');
        } else if (step === 'capabilities' && 'return' in msg) {
          step = 'command';
          send(execute);
        } else if (step === 'command' && 'return' in msg) {
          return finish(undefined, msg.return);
        }
      }
    });
  });
}

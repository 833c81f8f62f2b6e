import net from 'node:net';

/** The id of the channel's virtserialport (qemu.ts): QEMU names it in VSERPORT_CHANGE events. */
export const GUEST_PORT_ID = 'rbport';
const CONNECT_ATTEMPTS = 100;
const RETRY_MS = 20;

export interface PortWatch {
  close(): void;
}

/**
 * Tells when the guest's side of the channel is gone while QEMU runs on: the multiplexer
 * (guest/mux.c) holds the port's only open file, so its death (root in the guest has
 * CAP_KILL; `kill -KILL -1` reaches it, the guest having one pid namespace) closes the port,
 * and QEMU says so on its monitor (VSERPORT_CHANGE, open false). The chardev socket the host
 * reads does not: QEMU keeps it connected, and the host's commands would wait for answers
 * that never come. This reads a QMP monitor of its own (`eventsSocket`: QEMU's other monitor
 * serves the one-call-per-connection requests of qmp.ts). A VM whose QEMU has no such monitor
 * (started by an older worker) is not watched.
 */
export function watchGuestPort(eventsSocket: string, onClosed: () => void): PortWatch {
  let stopped = false;
  let socket: net.Socket | undefined;
  const connect = (attempt: number): void => {
    if (stopped) return;
    const s = net.createConnection(eventsSocket);
    socket = s;
    let connected = false;
    let buffered = '';
    s.on('connect', () => {
      connected = true;
      s.write('{"execute":"qmp_capabilities"}\n');
    });
    s.on('data', (chunk: Buffer) => {
      buffered += chunk.toString('utf8');
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (isPortClosed(line) && !stopped) {
          stopped = true;
          s.destroy();
          onClosed();
        }
      }
    });
    // Retried while QEMU makes its sockets; once connected, its end is QEMU's end (the channel reports that).
    s.on('error', () => {
      if (!connected && attempt < CONNECT_ATTEMPTS) setTimeout(() => connect(attempt + 1), RETRY_MS);
    });
  };
  connect(0);
  return {
    close() {
      stopped = true;
      socket?.destroy();
    },
  };
}

function isPortClosed(line: string): boolean {
  try {
    const m = JSON.parse(line) as { event?: string; data?: { id?: string; open?: boolean } };
    return m.event === 'VSERPORT_CHANGE' && m.data?.id === GUEST_PORT_ID && m.data.open === false;
  } catch {
    return false;
  }
}

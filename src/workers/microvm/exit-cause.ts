import fs from 'node:fs/promises';
import type { SandboxExit } from '../runtime/index.ts';

/** How much of a dead VM's console is read: the guest kernel's last words are at its end. */
const CONSOLE_TAIL_BYTES = 16 * 1024;

/** A console line, less the kernel's `[   12.345678] ` timestamp. */
const lineText = (line: string): string => line.replace(/^\[\s*\d+\.\d+\]\s?/, '').trim();

function lastIndexOf(lines: readonly string[], test: (line: string) => boolean): number {
  for (let i = lines.length - 1; i >= 0; i--) if (test(lines[i]!)) return i;
  return -1;
}

/**
 * Why a microVM ended, from the end of its serial console (QEMU writes the guest kernel's
 * console to a host file; `quiet` leaves warnings and worse). QEMU runs with `-no-reboot`
 * and the guest with `panic=-1`, so a guest panic or reset ends QEMU, which closes the
 * channel; this tells those apart from a VMM killed from outside, which leaves no word.
 *
 * Only the guest kernel writes that console: the sandbox has no console device, its
 * commands' output goes through the init's pipes, and the init's fds are not reachable
 * (non-dumpable). A panic line is matched at the start of a line, so text a command puts
 * into a kernel message (a process name in an OOM report) cannot pass for one unless the
 * guest then really dies; either way the loss is the sandbox's own.
 */
export function exitCauseFromConsole(consoleText: string): SandboxExit {
  const lines = consoleText.split('\n').map(lineText);
  const panicAt = lastIndexOf(lines, (l) => l.startsWith('Kernel panic - not syncing: '));
  if (panicAt >= 0) {
    const message = lines[panicAt]!.slice('Kernel panic - not syncing: '.length);
    // The OOM killer found nothing it may kill (the guest's init cannot be killed), or vm.panic_on_oom.
    if (/out of memory|deadlocked on memory/i.test(message)) return { reason: 'oom', detail: `the guest kernel ran out of memory: ${message}` };
    if (message.startsWith('Attempted to kill init')) {
      // The init exited; after the OOM killer's work, for want of memory.
      const oomBefore = lines.slice(Math.max(0, panicAt - 40), panicAt).some((l) => /^Out of memory/.test(l));
      return oomBefore ? { reason: 'oom', detail: `the guest's init died out of memory (guest kernel: ${message})` } : { reason: 'init_lost', detail: `the guest's init exited (guest kernel: ${message})` };
    }
    return { reason: 'guest_panic', detail: `the guest kernel panicked: ${message}` };
  }
  // A reset or power-off the guest asked for (sysrq, reboot(2) from its trusted side).
  const stoppedAt = lastIndexOf(lines, (l) => /^reboot: (Restarting system|Power down|System halted)/.test(l) || /^sysrq: (Resetting|Power Off)/.test(l));
  if (stoppedAt >= 0) return { reason: 'guest_panic', detail: `the guest kernel stopped the machine (${lines[stoppedAt]})` };
  return { reason: 'init_lost', detail: "the microVM's VMM exited with no panic or reset on the guest's console (killed from outside)" };
}

/** The end of a VM's console log (empty when there is none). */
export async function consoleTailOf(consoleLog: string, bytes = CONSOLE_TAIL_BYTES): Promise<string> {
  let handle;
  try {
    handle = await fs.open(consoleLog, 'r');
  } catch {
    return '';
  }
  try {
    const { size } = await handle.stat();
    const length = Math.min(size, bytes);
    const buffer = Buffer.alloc(length);
    await handle.read(buffer, 0, length, size - length);
    return buffer.toString('utf8');
  } finally {
    await handle.close();
  }
}

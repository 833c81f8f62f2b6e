import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';

/** The last error runc logged to its --log file (JSON lines), for error messages. */
export async function lastRuncError(logFile: string): Promise<string> {
  const text = await readFile(logFile, 'utf8').catch(() => '');
  const lines = text.trim().split('\n').reverse();
  for (const line of lines) {
    try {
      const rec = JSON.parse(line) as { level?: string; msg?: string };
      if (rec.level === 'error' || rec.level === 'fatal') return rec.msg ?? line;
    } catch {
      if (line) return line;
    }
  }
  return 'no error logged';
}

export interface RuncState {
  init_process_pid: number;
  init_process_start: number;
}

export async function readRuncState(stateFile: string): Promise<RuncState | undefined> {
  try {
    return JSON.parse(await readFile(stateFile, 'utf8')) as RuncState;
  } catch {
    return undefined;
  }
}

/**
 * Whether `pid` is alive (not a zombie) and is the same process that started at `startTicks`.
 * Synchronous: /proc never waits on a disk, and one read costs ~20 µs where the thread
 * pool's open/fstat/read/close round trips cost ~10x that (a host checks every sandbox).
 */
export function isProcessAlive(pid: number, startTicks: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the parenthesised command name; the name itself may contain spaces.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const state = rest[0];
    const start = Number(rest[19]);
    return state !== 'Z' && state !== 'X' && start === Number(startTicks);
  } catch {
    return false;
  }
}

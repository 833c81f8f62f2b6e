import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { RollboxError } from '../../api/index.ts';

export interface ToolResult {
  code: number;
  stderr: string;
}

/**
 * Run a short-lived host command (runc lifecycle calls, mount, umount) with an argument
 * array. stdout is discarded; stderr is kept (capped) for error messages.
 */
export function runQuiet(file: string, args: readonly string[], opts: { cwd?: string; stdio?: 'ignore-all'; extraFds?: readonly number[] } = {}): Promise<ToolResult> {
  return new Promise((resolve, reject) => {
    // extraFds become fds 3, 4, ... of the child (runc's --preserve-fds passes them on).
    const stdio = [...(opts.stdio === 'ignore-all' ? ['ignore', 'ignore', 'ignore'] : ['ignore', 'ignore', 'pipe']), ...(opts.extraFds ?? [])] as ('ignore' | 'pipe' | number)[];
    const child = spawn(file, args, { cwd: opts.cwd, stdio });
    let stderr = '';
    child.stderr?.on('data', (b: Buffer) => {
      if (stderr.length < 16_384) stderr += b.toString('utf8');
    });
    child.on('error', (e) => reject(new RollboxError('internal', `${file}: ${e.message}`)));
    child.on('close', (code, signal) => resolve({ code: code ?? (signal ? 128 : 1), stderr }));
  });
}

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

/** Whether `pid` is alive (not a zombie) and is the same process that started at `startTicks`. */
export async function isProcessAlive(pid: number, startTicks: number): Promise<boolean> {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    // Fields after the parenthesised command name; the name itself may contain spaces.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const state = rest[0];
    const start = Number(rest[19]);
    return state !== 'Z' && state !== 'X' && start === Number(startTicks);
  } catch {
    return false;
  }
}

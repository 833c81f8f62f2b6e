import { spawn } from 'node:child_process';
import { RollboxError } from '../api/index.ts';

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface RunToolOptions {
  cwd?: string;
  /** Bytes kept of stdout and of stderr each (default 64 KiB). */
  capBytes?: number;
  /** Written to the tool's stdin (otherwise stdin is /dev/null). */
  input?: string;
  /**
   * `'ignore'`: collect nothing. For a tool whose children inherit its stdio (`runc run -d`
   * hands it to the container): with pipes, 'close' would wait for the container.
   */
  output?: 'collect' | 'ignore';
  /** Open fds the tool gets as its fds 3, 4, ... (runc's --preserve-fds passes them on). */
  extraFds?: readonly number[];
}

/**
 * Run a host tool (mount, runc, nft, mkfs...) with an argument array (never a shell
 * string) and collect its output. Output is capped because these tools only print short
 * diagnostics; a runaway tool must not grow the worker's heap.
 */
export function runTool(file: string, args: readonly string[], opts: RunToolOptions = {}): Promise<RunResult> {
  const capBytes = opts.capBytes ?? 64 * 1024;
  const output = opts.output === 'ignore' ? 'ignore' : 'pipe';
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { cwd: opts.cwd, stdio: [opts.input === undefined ? 'ignore' : 'pipe', output, output, ...(opts.extraFds ?? [])] });
    if (opts.input !== undefined) {
      child.stdin!.on('error', () => undefined); // the tool may exit without reading (EPIPE)
      child.stdin!.end(opts.input);
    }
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let outBytes = 0;
    let errBytes = 0;
    child.stdout?.on('data', (b: Buffer) => {
      if (outBytes < capBytes) out.push(b);
      outBytes += b.length;
    });
    child.stderr?.on('data', (b: Buffer) => {
      if (errBytes < capBytes) err.push(b);
      errBytes += b.length;
    });
    child.on('error', (e) => reject(new RollboxError('internal', `${file}: ${e.message}`)));
    child.on('close', (code, signal) => {
      resolve({
        code: code ?? (signal ? 128 : 1),
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
      });
    });
  });
}

/** Like runTool, but a non-zero exit is an infrastructure failure. */
export async function runToolOk(file: string, args: readonly string[], opts: RunToolOptions = {}): Promise<RunResult> {
  const r = await runTool(file, args, opts);
  if (r.code !== 0) {
    throw new RollboxError('internal', `${file} ${args.join(' ')} failed (exit ${r.code}): ${r.stderr.trim().slice(0, 2000)}`);
  }
  return r;
}

/** Whether a process of this pid exists (one of another user's too); a child node has reaped is gone. */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

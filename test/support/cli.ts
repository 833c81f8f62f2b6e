import { spawn } from 'node:child_process';
import path from 'node:path';

const REPO_ROOT = path.resolve(import.meta.dirname, '../..');

export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** The real `rollbox` command as a child process against a gateway (ROLLBOX_URL, ROLLBOX_TOKEN), no stdin. */
export function runRollbox(args: string[], options: { url: string; token: string; cwd?: string }): Promise<CliRun> {
  const child = spawn(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), ...args], { cwd: options.cwd, env: { ...process.env, ROLLBOX_URL: options.url, ROLLBOX_TOKEN: options.token }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

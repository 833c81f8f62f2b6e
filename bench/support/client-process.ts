/**
 * A bench arm whose clients run in a process of their own, as callers' do: a client in the
 * bench's process (which holds the gateway and the worker host) would take its CPU turns
 * from their event loop and lengthen the very path it times. The arm's file is run with its
 * input as JSON on stdin, writes progress on stderr and its samples as one JSON line last.
 */
import { spawn } from 'node:child_process';
import { progressBar } from '../../src/report/index.ts';
import { timed } from './runc-floor.ts';

/** Runs the arm in `file` in a new process; resolves with what it answered. */
export async function runInClientProcess<I, O>(file: string, what: string, input: I): Promise<O> {
  const child = spawn(process.execPath, ['--import', 'tsx', file], { stdio: ['pipe', 'pipe', 'inherit'] });
  child.stdin.end(JSON.stringify(input));
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
  if (code !== 0) throw new Error(`${what} exited ${code}: ${out.slice(-500)}`);
  return JSON.parse(out.trim().split('\n').pop()!) as O;
}

/** In the arm's own process (when `file` is what was run): reads its input, runs `main`, writes its answer, exits. */
export async function serveClientProcess<I, O>(file: string, main: (input: I) => Promise<O>): Promise<void> {
  if (process.argv[1] !== file) return;
  let text = '';
  for await (const chunk of process.stdin) text += chunk;
  process.stdout.write(`${JSON.stringify(await main(JSON.parse(text) as I))}\n`);
  process.exit(0);
}

/** Each of `paths` timed once per run, in turn (so all see the same host), `runs` times, with a progress bar. */
export async function timedInTurn<K extends string>(label: string, runs: number, paths: Record<K, () => Promise<unknown>>): Promise<Record<K, number[]>> {
  const names = Object.keys(paths) as K[];
  const samples = Object.fromEntries(names.map((n) => [n, [] as number[]])) as Record<K, number[]>;
  const bar = progressBar(label, { total: runs });
  for (let i = 0; i < runs; i++) {
    for (const name of names) samples[name].push(await timed(paths[name]));
    bar.tick();
  }
  bar.done();
  return samples;
}

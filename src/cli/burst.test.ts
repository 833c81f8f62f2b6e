import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { runCli } from './index.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-burst-cli-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

/** Runs `rollbox ...args` in-process; returns what it printed on stdout. */
async function rollbox(...args: string[]): Promise<string> {
  const printed: string[] = [];
  const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk) => {
    printed.push(String(chunk));
    return true;
  });
  try {
    await runCli(['node', 'rollbox', ...args]);
  } finally {
    spy.mockRestore();
  }
  return printed.join('');
}

const lastJson = (out: string) => JSON.parse(out.trim().split('\n').at(-1)!);

describe('rollbox burst', () => {
  const trace = path.join(dir, 'trace.jsonl');

  it('generate writes a trace that simulate replays, with a table and a JSON line', async () => {
    const generated = lastJson(await rollbox('burst', 'generate', '--out', trace, '--duration', '20m', '--seed', '3', '--rate', '0.6'));
    expect(generated.events).toBeGreaterThan(300);
    expect(fs.readFileSync(trace, 'utf8').split('\n')[0]).toContain('"format":"rollbox-burst-trace"');

    const out = await rollbox('burst', 'simulate', '--trace', trace, '--local-nodes', '3', '--provisioning-delay', '30s', '--sync-delay', '0', '--seed', '3');
    expect(out).toMatch(/queue wait p50 \/ p99 \/ mean/);
    const { result, model, policy } = lastJson(out);
    expect(result.creates).toBe(generated.events);
    expect(model).toMatchObject({ localNodes: 3, cloudProvisioningDelayMs: 30_000, cloudLayerSyncDelayMs: 0, seed: 3 });
    expect(policy.divertAboveUtilization).toBe(0.8);
  });

  it('sweep writes the CSV and the chart', async () => {
    const out = path.join(dir, 'sweep');
    const summary = lastJson(await rollbox('burst', 'sweep', '--trace', trace, '--out', out, '--local-nodes', '3', '--thresholds', '0.8,1', '--gaps', '0.1', '--caps', '0,2'));
    expect(summary.runs).toBe(4);
    expect(fs.readFileSync(path.join(out, 'sweep.csv'), 'utf8').trim().split('\n')).toHaveLength(5);
    expect(fs.readFileSync(path.join(out, 'sweep.svg'), 'utf8')).toContain('<svg');
  });
});

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch, BatchResultLine } from '../src/api/index.ts';
import { BatchesClient, RollboxClient } from '../src/client/index.ts';
import { startTestCluster, type TestCluster } from './support/cluster.ts';

const REPO_ROOT = path.resolve(import.meta.dirname, '..');

let cluster: TestCluster;
let token: string;
let dir: string;

interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** The real `rollbox` command as a child process; `stdoutFile`: its stdout redirected there, as `> file` does. */
function rollbox(args: string[], options: { stdoutFile?: string } = {}): Promise<CliRun> {
  const fd = options.stdoutFile ? fs.openSync(options.stdoutFile, 'w') : undefined;
  const child = spawn(process.execPath, [path.join(REPO_ROOT, 'bin/rollbox.js'), ...args], {
    cwd: dir,
    env: { ...process.env, ROLLBOX_URL: cluster.url, ROLLBOX_TOKEN: token },
    stdio: ['ignore', fd ?? 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout?.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => {
      if (fd !== undefined) fs.closeSync(fd);
      resolve({ code, stdout, stderr });
    });
  });
}

function writeTasks(name: string, tasks: unknown[]): string {
  const file = path.join(dir, name);
  fs.writeFileSync(file, tasks.map((t) => JSON.stringify(t)).join('\n') + '\n');
  return file;
}

const task = (customId: string, cmd: string) => ({ customId, resources: { memoryMiB: 32, cpuMillis: 100 }, steps: [{ cmd, timeoutMs: 30_000 }] });

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'cli-node' }], env: { ROLLBOX_BATCH_SLOTS: '8' } });
  token = await cluster.token('t', ['batch:submit']);
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rollbox-batch-cli-'));
});
afterAll(async () => {
  await cluster?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

describe('rollbox batch (CLI)', () => {
  it('submits a file with --follow: the batch id, then a summary with the right counts; results > out.jsonl', async () => {
    // 20 tasks: every fourth exits 3.
    const tasks = Array.from({ length: 20 }, (_, i) => (i % 4 === 3 ? task(`bad-${i}`, 'echo nope >&2; exit 3') : task(`ok-${i}`, 'echo ok')));
    const file = writeTasks('tasks.jsonl', tasks);
    const run = await rollbox(['batch', 'submit', file, '--max-concurrency', '8', '--metadata', 'suite=cli,run=1', '--follow']);
    expect(run.stderr).toBe('');
    expect(run.code).toBe(0);
    const [idLine, ...summary] = run.stdout.split('\n');
    expect(idLine).toMatch(/^batch_[a-z0-9]+$/);
    const id = idLine!;
    const table = summary.join('\n');
    expect(table).toMatch(new RegExp(`^batch\\s+${id} completed$`, 'm'));
    expect(table).toMatch(/^tasks\s+20$/m);
    expect(table).toMatch(/^succeeded\s+15$/m);
    expect(table).toMatch(/^failed\s+5$/m);
    expect(table).toMatch(/^timeout\s+0$/m);
    expect(table).toMatch(/^cancelled\s+0$/m);
    expect(table).toMatch(/^wall time\s+[\d.]+ s$/m);
    expect(table).toMatch(/^tasks\/s\s+[\d.]+$/m);
    expect(table).toMatch(/^slowest 5:$/m);
    expect(table).toMatch(/^failures \(5\):$/m);
    for (const i of [3, 7, 11, 15, 19]) expect(table).toMatch(new RegExp(`^  bad-${i}\\s+failed\\s+exit 3 \\(step 1\\): nope$`, 'm'));

    // The batch as JSON, with the options given on the command line.
    const status = await rollbox(['batch', 'status', id]);
    expect(status.code).toBe(0);
    const batch = JSON.parse(status.stdout) as Batch;
    expect(batch).toMatchObject({ id, state: 'completed', counts: { total: 20, succeeded: 15, failed: 5 }, options: { maxConcurrency: 8, metadata: { suite: 'cli', run: '1' } } });

    // Results redirected to a file: one line per task, each task once.
    const outFile = path.join(dir, 'out.jsonl');
    const results = await rollbox(['batch', 'results', id], { stdoutFile: outFile });
    expect(results.code).toBe(0);
    const lines = fs.readFileSync(outFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as BatchResultLine);
    expect(lines).toHaveLength(20);
    expect(new Set(lines.map((l) => l.customId))).toEqual(new Set(tasks.map((t) => t.customId)));
    expect(lines.find((l) => l.customId === 'ok-0')).toMatchObject({ status: 'succeeded', steps: [{ exitCode: 0, stdout: 'ok\n' }] });
    expect(lines.find((l) => l.customId === 'bad-3')).toMatchObject({ status: 'failed', steps: [{ exitCode: 3 }] });
    // After a cursor: only what came after it.
    const rest = await rollbox(['batch', 'results', id, '--after', lines[14]!.cursor]);
    expect(rest.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l).customId)).toEqual(lines.slice(15).map((l) => l.customId));

    const list = await rollbox(['batch', 'list']);
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(new RegExp(`^${id}\\s+completed\\s+20/20\\s+5\\s`, 'm'));
    const one = await rollbox(['batch', 'task', id, 'bad-7']);
    expect(JSON.parse(one.stdout)).toMatchObject({ customId: 'bad-7', state: 'done', status: 'failed' });
  }, 180_000);

  it('cancels a running batch: it ends cancelled, every task accounted for', async () => {
    const tasks = Array.from({ length: 20 }, (_, i) => task(`slow-${i}`, 'sleep 1'));
    const file = writeTasks('slow.jsonl', tasks);
    const submitted = await rollbox(['batch', 'submit', file, '--max-concurrency', '1']);
    expect(submitted.code).toBe(0);
    const id = submitted.stdout.trim();
    expect(id).toMatch(/^batch_[a-z0-9]+$/);

    const cancel = await rollbox(['batch', 'cancel', id]);
    expect(cancel.code).toBe(0);
    expect(cancel.stdout).toMatch(new RegExp(`^${id} (cancelling|cancelled)\\n$`));
    // Following the results ends once the batch has ended.
    const followed = await rollbox(['batch', 'results', id, '--follow']);
    expect(followed.code).toBe(0);
    const lines = followed.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l) as BatchResultLine);
    expect(lines).toHaveLength(20);
    const batch = JSON.parse((await rollbox(['batch', 'status', id])).stdout) as Batch;
    expect(batch.state).toBe('cancelled');
    expect(batch.counts.cancelled).toBeGreaterThan(0);
    expect(batch.counts.succeeded + batch.counts.cancelled).toBe(20);
    expect(lines.filter((l) => l.status === 'cancelled')).toHaveLength(batch.counts.cancelled);
  }, 120_000);

  it('refuses a file with a bad line, naming it; and reports API errors as rollbox: <code>: <message>', async () => {
    const file = path.join(dir, 'bad.jsonl');
    fs.writeFileSync(file, `${JSON.stringify(task('a', 'true'))}\n{"customId":"b","steps":[]}\n${JSON.stringify(task('c', 'true'))}\n`);
    const run = await rollbox(['batch', 'submit', file, '--follow']);
    expect(run.code).not.toBe(0);
    expect(run.stdout).toBe('');
    expect(run.stderr).toMatch(/^rollbox: invalid_request: batch batch_[a-z0-9]+ failed: line 2: steps: /);

    const notJson = writeTasks('not-json.jsonl', [task('a', 'true')]);
    fs.appendFileSync(notJson, '{oops\n');
    const second = await rollbox(['batch', 'submit', notJson]);
    expect(second.code).not.toBe(0);
    expect(second.stderr).toMatch(/^rollbox: invalid_request: .*line 2 is not JSON/);

    const missing = await rollbox(['batch', 'status', 'batch_nosuchbatch']);
    expect(missing.code).not.toBe(0);
    expect(missing.stderr).toMatch(/^rollbox: not_found: /);
    const badFlag = await rollbox(['batch', 'submit', notJson, '--max-concurrency', 'many']);
    expect(badFlag.code).not.toBe(0);
    expect(badFlag.stderr).toMatch(/^rollbox: invalid_request: --max-concurrency: /);
  }, 60_000);
});

describe('BatchesClient', () => {
  it('streams an NDJSON submit and follows the results to the end, resuming from the cursor after dropped requests', async () => {
    let resultRequests = 0;
    let retries = 0;
    // Every third results request fails as a dropped connection would.
    const flaky: typeof fetch = async (input, init) => {
      if (String(input).includes('/results?') && ++resultRequests % 3 === 0) throw new TypeError('fetch failed', { cause: new Error('socket hang up') });
      return fetch(input, init);
    };
    const client = new BatchesClient(new RollboxClient({ baseUrl: cluster.url, token, fetch: flaky, retry: { baseDelayMs: 10, maxDelayMs: 50 }, onRetry: () => retries++ }));
    async function* lines() {
      for (let i = 0; i < 12; i++) yield `${JSON.stringify(task(`c${i}`, `echo ${i}`))}\n`;
    }
    const batch = await client.submitBatchNdjson(lines(), { maxConcurrency: 4, metadata: { from: 'client' } });
    expect(batch).toMatchObject({ counts: { total: 12 }, options: { maxConcurrency: 4, metadata: { from: 'client' } } });

    const seen: BatchResultLine[] = [];
    for await (const line of client.batchResults(batch.id, { follow: true, limit: 5 })) seen.push(line);
    expect(seen.map((l) => l.customId).sort()).toEqual(Array.from({ length: 12 }, (_, i) => `c${i}`).sort());
    expect(seen.every((l) => l.status === 'succeeded' && l.steps[0]!.stdout === `${l.customId.slice(1)}\n`)).toBe(true);
    expect(retries).toBeGreaterThan(0);
    expect((await client.getBatch(batch.id)).state).toBe('completed');

    // Without follow, after a cursor: the rest, then the end.
    const rest: string[] = [];
    for await (const line of client.batchResults(batch.id, { after: seen[4]!.cursor })) rest.push(line.customId);
    expect(rest).toEqual(seen.slice(5).map((l) => l.customId));
    expect((await client.listBatches()).map((b) => b.id)).toContain(batch.id);
    expect(await client.batchTask(batch.id, 'c0')).toMatchObject({ state: 'done', status: 'succeeded' });
    await expect(client.submitBatch({ tasks: [task('x', 'true'), task('x', 'true')] })).rejects.toMatchObject({ code: 'invalid_request', status: 400 });
  }, 120_000);
});

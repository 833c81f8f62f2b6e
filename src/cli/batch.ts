/**
 * `rollbox batch submit | results | status | task | cancel | list`: evaluation batches
 * against a gateway (--url / ROLLBOX_URL, --token / ROLLBOX_TOKEN with scope batch:submit).
 * Results go to stdout as NDJSON, progress to stderr, so `> out.jsonl` keeps only results.
 */
import fs from 'node:fs';
import type { Command } from 'commander';
import type { Batch, BatchResultLine, TaskStatus } from '../api/index.ts';
import { BatchesClient, type BatchSubmitOptions } from '../client/index.ts';
import { progressBar } from '../report/index.ts';
import { CliError, connect, out, reported, table, withConnection as withConnectionFor, type ConnectionFlags } from './common.ts';

const SLOWEST = 5;
const FAILED_SHOWN = 20;

function withConnection(command: Command): Command {
  return withConnectionFor(command, 'batch:submit');
}

function clientOf(flags: ConnectionFlags): BatchesClient {
  return new BatchesClient(connect(flags));
}

function positiveInt(flag: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new CliError('invalid_request', `${flag}: expected a positive integer, got ${JSON.stringify(value)}`);
  return n;
}

/** `k=v,k2=v2` (a value holds no comma). */
function metadataOf(value: string | undefined): Record<string, string> | undefined {
  if (value === undefined) return undefined;
  const metadata: Record<string, string> = {};
  for (const pair of value.split(',').filter((p) => p.trim() !== '')) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new CliError('invalid_request', `--metadata: expected k=v,..., got ${JSON.stringify(pair)}`);
    metadata[pair.slice(0, eq).trim()] = pair.slice(eq + 1);
  }
  return metadata;
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
}

/** A task's own time: its steps and its grade (the line has no start time). */
function durationOf(line: BatchResultLine): number {
  return line.steps.reduce((sum, s) => sum + s.durationMs, 0) + (line.grade?.durationMs ?? 0);
}

/** Why a task did not succeed: the platform's error, or its last step's exit, timeout or OOM kill. */
function whyFailed(line: BatchResultLine): string {
  if (line.error) return `${line.error.code}: ${line.error.message}`;
  const step = line.steps.at(-1);
  if (!step) return line.status;
  const where = `step ${line.steps.length}`;
  const stderr = step.stderr.trim().split('\n').at(-1)?.slice(0, 80);
  const what = step.timedOut ? `timed out after ${seconds(step.durationMs)}` : step.oomKilled ? 'killed: out of memory' : `exit ${step.exitCode}`;
  return `${what} (${where})${stderr ? `: ${stderr}` : ''}`;
}

/** What a followed batch's lines add up to, kept small: counts, the slowest few, the first failures. */
class Summary {
  lines = 0;
  graded = { passed: 0, failed: 0 };
  readonly slowest: { customId: string; ms: number; status: TaskStatus }[] = [];
  readonly failed: BatchResultLine[] = [];
  failedCount = 0;

  add(line: BatchResultLine): void {
    this.lines++;
    if (line.grade) this.graded[line.grade.passed ? 'passed' : 'failed']++;
    const ms = durationOf(line);
    if (this.slowest.length < SLOWEST || ms > this.slowest.at(-1)!.ms) {
      this.slowest.push({ customId: line.customId, ms, status: line.status });
      this.slowest.sort((a, b) => b.ms - a.ms);
      this.slowest.length = Math.min(this.slowest.length, SLOWEST);
    }
    if (line.status === 'failed' || line.status === 'timeout' || line.status === 'infra_error') {
      this.failedCount++;
      if (this.failed.length < FAILED_SHOWN) this.failed.push(line);
    }
  }

  table(batch: Batch, wallMs: number): string {
    const rows: [string, string][] = [
      ['batch', `${batch.id} ${batch.state}${batch.error ? ` (${batch.error.code}: ${batch.error.message})` : ''}`],
      ['tasks', String(batch.counts.total)],
      ...(['succeeded', 'failed', 'timeout', 'infra_error', 'cancelled'] as const).map((s): [string, string] => [s, String(batch.counts[s])]),
      ...(this.graded.passed + this.graded.failed > 0 ? [['graded passed / failed', `${this.graded.passed} / ${this.graded.failed}`] as [string, string]] : []),
      ['wall time', seconds(wallMs)],
      ['tasks/s', (this.lines / Math.max(wallMs / 1000, 0.001)).toFixed(2)],
    ];
    const width = Math.max(...rows.map(([k]) => k.length));
    const text = rows.map(([k, v]) => `${k.padEnd(width)}  ${v}`);
    const idWidth = Math.max(0, ...this.slowest.map((s) => s.customId.length), ...this.failed.map((l) => l.customId.length));
    if (this.slowest.length > 0) {
      text.push('', `slowest ${this.slowest.length}:`);
      for (const s of this.slowest) text.push(`  ${s.customId.padEnd(idWidth)}  ${seconds(s.ms).padStart(9)}  ${s.status}`);
    }
    if (this.failedCount > 0) {
      text.push('', `failures (${this.failedCount}):`);
      for (const l of this.failed) text.push(`  ${l.customId.padEnd(idWidth)}  ${l.status.padEnd(11)}  ${whyFailed(l)}`);
      if (this.failedCount > this.failed.length) text.push(`  ... and ${this.failedCount - this.failed.length} more (rollbox batch results ${batch.id})`);
    }
    return `${text.join('\n')}\n`;
  }
}

/** Follows a batch to its end with a progress bar on stderr; the summary table on stdout. */
async function follow(client: BatchesClient, batch: Batch, startedAt: number, showProgress: boolean): Promise<void> {
  const total = batch.counts.total;
  const bar = progressBar(batch.id, { enabled: showProgress });
  const onSignal = () => {
    bar.done();
    process.stderr.write(`rollbox: batch ${batch.id} keeps running; follow it again with: rollbox batch results ${batch.id} --follow\n`);
    process.exit(130);
  };
  process.once('SIGINT', onSignal);
  const summary = new Summary();
  let lastDraw = 0;
  const draw = () => {
    bar.update(total ? summary.lines / total : 1, `${summary.lines}/${total}${summary.failedCount ? `, ${summary.failedCount} failures` : ''}`);
    lastDraw = performance.now();
  };
  for await (const line of client.batchResults(batch.id, { follow: true })) {
    summary.add(line);
    if (performance.now() - lastDraw > 200 || summary.lines === total) draw();
  }
  draw();
  bar.done();
  process.off('SIGINT', onSignal);
  const final = await client.getBatch(batch.id);
  await out(summary.table(final, performance.now() - startedAt));
  if (final.state !== 'completed') throw new CliError(final.state, `batch ${final.id} ended ${final.state}${final.error ? `: ${final.error.message}` : ''}`);
}

function listTable(batches: Batch[]): string {
  const rows = [['ID', 'STATE', 'DONE/TOTAL', 'NOT OK', 'CREATED']];
  for (const b of batches) {
    const c = b.counts;
    const done = c.succeeded + c.failed + c.timeout + c.infra_error + c.cancelled;
    rows.push([b.id, b.state, `${done}/${c.total}`, String(c.failed + c.timeout + c.infra_error), b.createdAt]);
  }
  return table(rows);
}

export function registerBatchCommands(program: Command): void {
  const batch = program.command('batch').description('evaluation batches: submit tasks, follow them, read their results');

  withConnection(
    batch
      .command('submit')
      .description('submit FILE (NDJSON: one task per line; - for stdin), streamed; prints the batch id')
      .argument('<file>', 'tasks, one JSON object per line')
      .option('--max-concurrency <n>', 'sandboxes of this batch at once (default 16)')
      .option('--max-attempts <n>', 'tries of a task the platform failed (default 3)')
      .option('--completion-window <seconds>', 'tasks not done this long after the submit end cancelled (default 86400)')
      .option('--class <class>', 'latency or besteffort (default besteffort)')
      .option('--metadata <k=v,...>', 'labels kept with the batch')
      .option('--follow', 'wait for the end: a progress bar on stderr, then a summary on stdout')
      .option('--progress', 'draw the progress bar even when stderr is not a terminal'),
  ).action(
    reported(async (file: string, flags: ConnectionFlags & Record<string, string | boolean | undefined>) => {
      const options: BatchSubmitOptions = {
        maxConcurrency: positiveInt('--max-concurrency', flags.maxConcurrency as string | undefined),
        maxAttempts: positiveInt('--max-attempts', flags.maxAttempts as string | undefined),
        completionWindowSeconds: positiveInt('--completion-window', flags.completionWindow as string | undefined),
        class: flags.class as BatchSubmitOptions['class'],
        metadata: metadataOf(flags.metadata as string | undefined),
      };
      const client = clientOf(flags);
      const startedAt = performance.now();
      // Opened here so a missing file is reported as such, not as a failed upload.
      if (file !== '-' && !(await fs.promises.stat(file)).isFile()) throw new CliError('invalid_request', `${file}: not a regular file`);
      const body = file === '-' ? process.stdin : fs.createReadStream(file);
      const submitted = await client.submitBatchNdjson(body, options);
      await out(`${submitted.id}\n`);
      if (flags.follow) await follow(client, submitted, startedAt, Boolean(flags.progress) || process.stderr.isTTY === true);
    }),
  );

  withConnection(
    batch
      .command('results')
      .description('write the result lines (NDJSON, one per ended task) to stdout')
      .argument('<id>', 'batch id')
      .option('--after <cursor>', 'only lines after this cursor')
      .option('--follow', 'keep reading until the batch has ended'),
  ).action(
    reported(async (id: string, flags: ConnectionFlags & { after?: string; follow?: boolean }) => {
      const client = clientOf(flags);
      // A closed pipe (`| head`) ends the command quietly.
      process.stdout.on('error', (err: NodeJS.ErrnoException) => {
        if (err.code === 'EPIPE') process.exit(0);
      });
      for await (const line of client.batchResults(id, { after: flags.after, follow: Boolean(flags.follow) })) await out(`${JSON.stringify(line)}\n`);
    }),
  );

  withConnection(batch.command('status').description('the batch as JSON: state, counts, a timestamp per state').argument('<id>', 'batch id')).action(
    reported(async (id: string, flags: ConnectionFlags) => {
      await out(`${JSON.stringify(await clientOf(flags).getBatch(id), null, 2)}\n`);
    }),
  );

  withConnection(batch.command('task').description('where one task stands, as JSON').argument('<id>', 'batch id').argument('<customId>', 'the task\'s customId')).action(
    reported(async (id: string, customId: string, flags: ConnectionFlags) => {
      await out(`${JSON.stringify(await clientOf(flags).batchTask(id, customId))}\n`);
    }),
  );

  withConnection(batch.command('cancel').description('cancel: queued tasks end now, running ones soon; finished results stay').argument('<id>', 'batch id')).action(
    reported(async (id: string, flags: ConnectionFlags) => {
      const cancelled = await clientOf(flags).cancelBatch(id);
      await out(`${cancelled.id} ${cancelled.state}\n`);
    }),
  );

  withConnection(
    batch
      .command('list')
      .description("the tenant's batches, newest first")
      .option('--limit <n>', 'at most this many', '100')
      .option('--json', 'as JSON'),
  ).action(
    reported(async (flags: ConnectionFlags & { limit: string; json?: boolean }) => {
      const batches = await clientOf(flags).listBatches({ limit: positiveInt('--limit', flags.limit) });
      await out(flags.json ? `${JSON.stringify({ batches }, null, 2)}\n` : listTable(batches));
    }),
  );
}

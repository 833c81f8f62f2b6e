/**
 * `rollbox image import | pull | build | list | show | delete`: images on a gateway (--url / ROLLBOX_URL,
 * --token / ROLLBOX_TOKEN; import and delete need scope layer:write, reads layer:read).
 * An import streams a `docker save` archive or an OCI image layout (a tar) from a file or
 * stdin, never read whole; a pull asks the gateway to pull a registry reference and follows
 * its record until it ends. Progress goes to stderr, the summary (or --json) to stdout.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import type { ImageRecord, ImportedImage } from '../api/index.ts';
import { ImagesClient } from '../client/index.ts';
import { progressBar, type ProgressBar } from '../report/index.ts';
import { CliError, connect, out, reported, table, withConnection, type ConnectionFlags } from './common.ts';
import { registerImageBuildCommand } from './image-build.ts';

const READ_CHUNK_BYTES = 256 * 1024;
const MIB = 1024 * 1024;
/** Notes are padded to this width, so a shorter one overwrites a longer one on the same line. */
const NOTE_WIDTH = 56;

function clientOf(flags: ConnectionFlags): ImagesClient {
  return new ImagesClient(connect(flags));
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
}

/** MiB (sizes of layers and images): two decimals under 10, one above. */
function mib(bytes: number): string {
  return (bytes / MIB).toFixed(bytes < 10 * MIB ? 2 : 1);
}

/** MB (bytes on the wire, and rates). */
function mb(bytes: number): string {
  return (bytes / 1e6).toFixed(bytes < 10e6 ? 2 : 1);
}

/**
 * An upload's progress on stderr: bytes sent (of the file's size when known: a bar) and the
 * rate; once every byte is sent, the time spent waiting for the gateway to build the last
 * layers. Redrawn at most every 100 ms while sending, every second while waiting.
 */
class UploadProgress {
  private sent = 0;
  private readonly startedAt = performance.now();
  private uploadedAt: number | undefined;
  private lastDraw = 0;
  private timer: NodeJS.Timeout | undefined;
  private readonly bar: ProgressBar | undefined;

  constructor(
    private readonly label: string,
    private readonly total: number | undefined,
    private readonly enabled: boolean,
  ) {
    if (enabled && total !== undefined) this.bar = progressBar(label, { enabled });
    this.draw();
  }

  add(bytes: number): void {
    this.sent += bytes;
    if (this.total !== undefined && this.sent >= this.total) this.uploaded();
    else if (performance.now() - this.lastDraw >= 100) this.draw();
  }

  /** Every byte is sent: from now on the gateway is finishing the import. */
  uploaded(): void {
    if (this.uploadedAt !== undefined) return;
    this.uploadedAt = performance.now();
    this.draw();
    if (this.enabled) this.timer = setInterval(() => this.draw(), 1000).unref();
  }

  done(): void {
    clearInterval(this.timer);
    if (!this.enabled) return;
    this.draw();
    if (this.bar) this.bar.done();
    else process.stderr.write('\n');
  }

  private draw(): void {
    if (!this.enabled) return;
    const now = performance.now();
    this.lastDraw = now;
    const sendingMs = (this.uploadedAt ?? now) - this.startedAt;
    const rate = `${mb(this.sent / Math.max(sendingMs / 1000, 0.001))} MB/s`;
    const bytes = this.total === undefined ? `${mb(this.sent)} MB` : `${mb(this.sent)}/${mb(this.total)} MB`;
    const note = this.uploadedAt === undefined ? `${bytes}, ${rate}` : `${bytes} sent (${rate}), waiting for the layers to build ${Math.floor((now - this.uploadedAt) / 1000)} s`;
    if (this.bar) this.bar.update(this.total ? this.sent / this.total : 1, note.padEnd(NOTE_WIDTH));
    else process.stderr.write(`\r${this.label.padEnd(24)} ${note.padEnd(NOTE_WIDTH)}`);
  }
}

/** The chunks of a file (or stdin), counted as fetch takes them. */
async function* counted(source: AsyncIterable<Buffer>, progress: UploadProgress): AsyncGenerator<Uint8Array> {
  for await (const chunk of source) {
    progress.add(chunk.length);
    yield chunk;
  }
  progress.uploaded();
}

function summary(image: ImportedImage, wallMs: number): string {
  const report = image.import;
  return table([
    ['name', image.name],
    ['digest', image.digest ?? '-'],
    ['platform', image.platform],
    ['layers', `${image.layers.length} (${report.layersBuilt} built, ${report.layersReused} reused)`],
    ['size', `${mib(image.sizeBytes)} MiB`],
    ['archive', `${mb(report.archiveBytes)} MB read`],
    ['time', seconds(wallMs)],
  ]);
}

function listTable(images: ImageRecord[]): string {
  const rows = [['NAME', 'PLATFORM', 'LAYERS', 'SIZE MiB', 'CREATED', 'SYNCED', 'STATE']];
  for (const i of images) {
    const state = i.pull?.state === 'pulling' ? 'pulling' : i.state;
    rows.push([i.name, i.platform, String(i.layers.length), mib(i.sizeBytes), i.createdAt, i.synced === undefined ? '-' : i.synced ? 'yes' : 'no', state]);
  }
  return table(rows);
}

/** A pull's progress on stderr from the record's `pull.progress`: layers and MB done of total, and the rate. */
function drawPull(bar: ProgressBar, record: ImageRecord, startedAt: number): void {
  const p = record.pull?.progress;
  if (!p || p.layersTotal === 0) return bar.update(0, 'resolving the manifest'.padEnd(NOTE_WIDTH));
  const rate = `${mb(p.bytesFetched / Math.max((performance.now() - startedAt) / 1000, 0.001))} MB/s`;
  bar.update(p.bytesTotal ? p.bytesDone / p.bytesTotal : p.layersDone / p.layersTotal, `${p.layersDone}/${p.layersTotal} layers, ${mb(p.bytesDone)}/${mb(p.bytesTotal)} MB, ${rate}`.padEnd(NOTE_WIDTH));
}

function pullSummary(image: ImageRecord, wallMs: number): string {
  const p = image.pull?.progress;
  return table([
    ['name', image.name],
    ['ref', image.ref ?? '-'],
    ['digest', image.digest ?? '-'],
    ['platform', image.platform],
    ['layers', `${image.layers.length} (${p ? p.layersTotal - p.layersReused : 0} fetched, ${p?.layersReused ?? 0} reused)`],
    ['size', `${mib(image.sizeBytes)} MiB`],
    ['fetched', `${mb(p?.bytesFetched ?? 0)} MB`],
    ['time', seconds(wallMs)],
  ]);
}

export function registerImageCommands(program: Command): void {
  const image = program.command('image').description('images: import a docker save archive or an OCI layout, pull from a registry, build from a Dockerfile, list, show, delete');
  registerImageBuildCommand(image);

  withConnection(
    image
      .command('import')
      .description('import FILE (a docker save archive or an OCI image layout tar; - for stdin), streamed; prints a summary')
      .argument('<file>', 'the archive')
      .requiredOption('--name <name>', "the image's name (what a create's image.base takes)")
      .option('--platform <os/arch>', 'which image of a multi-platform index (default linux/amd64)')
      .option('--ref <tag>', 'which image of an archive holding several (repo:tag or an OCI ref name)')
      .option('--json', 'print the imported image as JSON instead of the summary')
      .option('--progress', 'draw the progress bar even when stderr is not a terminal'),
    'layer:write',
  ).action(
    reported(async (file: string, flags: ConnectionFlags & { name: string; platform?: string; ref?: string; json?: boolean; progress?: boolean }) => {
      const client = clientOf(flags);
      let total: number | undefined;
      if (file === '-') {
        if (process.stdin.isTTY) throw new CliError('invalid_request', 'stdin is a terminal: pipe an archive in, or name a file');
      } else {
        // Looked at here so a missing file is reported as such, not as a failed upload.
        const stat = await fs.promises.stat(file);
        if (!stat.isFile()) throw new CliError('invalid_request', `${file}: not a regular file`);
        total = stat.size;
      }
      const source = file === '-' ? process.stdin : fs.createReadStream(file, { highWaterMark: READ_CHUNK_BYTES });
      const startedAt = performance.now();
      const progress = new UploadProgress(file === '-' ? `${flags.name} (stdin)` : path.basename(file), total, Boolean(flags.progress) || process.stderr.isTTY === true);
      let imported: ImportedImage;
      try {
        imported = await client.importImage(counted(source, progress), { name: flags.name, platform: flags.platform, ref: flags.ref });
      } finally {
        progress.done();
        if (source !== process.stdin) source.destroy();
      }
      await out(flags.json ? `${JSON.stringify(imported, null, 2)}\n` : summary(imported, performance.now() - startedAt));
    }),
  );

  withConnection(
    image
      .command('pull')
      .description('pull REF from its registry ([registry/]name[:tag][@digest], as docker takes it) and wait until it is ready; prints a summary')
      .argument('<ref>', 'the image reference')
      .option('--name <name>', "the image's name (default: derived from the ref, `python:3.12` -> `python-3.12`)")
      .option('--platform <os/arch>', 'which image of a multi-platform index (default linux/amd64)')
      .option('--json', 'print the pulled image record as JSON instead of the summary')
      .option('--progress', 'draw the progress bar even when stderr is not a terminal'),
    'layer:write',
  ).action(
    reported(async (ref: string, flags: ConnectionFlags & { name?: string; platform?: string; json?: boolean; progress?: boolean }) => {
      const client = clientOf(flags);
      const startedAt = performance.now();
      const started = await client.pullImage({ ref, name: flags.name, platform: flags.platform });
      const bar = progressBar(started.name, { enabled: Boolean(flags.progress) || process.stderr.isTTY === true });
      let pulled: ImageRecord;
      try {
        drawPull(bar, started, startedAt);
        pulled = await client.waitForImage(started.name, { pullId: started.pull?.id, pollMs: 250, onProgress: (r) => drawPull(bar, r, startedAt) });
        drawPull(bar, pulled, startedAt);
      } finally {
        bar.done();
      }
      await out(flags.json ? `${JSON.stringify(pulled, null, 2)}\n` : pullSummary(pulled, performance.now() - startedAt));
    }),
  );

  withConnection(image.command('list').description('the imported images (shared by the cluster, like layers)').option('--json', 'as JSON'), 'layer:read').action(
    reported(async (flags: ConnectionFlags & { json?: boolean }) => {
      const images = await clientOf(flags).listImages();
      await out(flags.json ? `${JSON.stringify({ images }, null, 2)}\n` : listTable(images));
    }),
  );

  withConnection(image.command('show').description('the image as JSON: its layers lowest first, its config').argument('<name>', 'image name'), 'layer:read').action(
    reported(async (name: string, flags: ConnectionFlags) => {
      await out(`${JSON.stringify(await clientOf(flags).getImage(name), null, 2)}\n`);
    }),
  );

  withConnection(image.command('delete').description('remove the image; its layers stay while sandboxes or other images use them').argument('<name>', 'image name'), 'layer:write').action(
    reported(async (name: string, flags: ConnectionFlags) => {
      const deleted = await clientOf(flags).deleteImage(name);
      await out(`${deleted.name} deleted\n`);
    }),
  );
}

/**
 * `rollbox image build -f Dockerfile CONTEXT --name N`: the context directory packed into a
 * tar (what its .dockerignore excludes left out, as docker's CLI does), uploaded, the build
 * started and its log followed: a progress bar of steps on stderr, the summary on stdout.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Command } from 'commander';
import type { Build } from '../api/index.ts';
import type { TarHeader } from '../builds/index.ts';
import { BuildsClient, type BuildStreamEvent } from '../client/index.ts';

import { progressBar } from '../report/index.ts';
import { CliError, connect, out, reported, table, withConnection, type ConnectionFlags } from './common.ts';

/** A directory as tar entries named relative to it; symlinks stay links; what .dockerignore excludes is left out (but never it, nor the Dockerfile). */
export async function packContext(dir: string, keep: readonly string[]): Promise<Buffer> {
  // Imported here: the builds module brings the build service (BullMQ), seconds of loading for every other command.
  const { dockerignore, packTar } = await import('../builds/index.ts');
  const ignoreText = await fs.readFile(path.join(dir, '.dockerignore'), 'utf8').catch(() => undefined);
  const ignored = dockerignore(ignoreText);
  const entries: { header: TarHeader; data?: Buffer }[] = [];
  const walk = async (rel: string): Promise<void> => {
    for (const dirent of (await fs.readdir(path.join(dir, rel), { withFileTypes: true })).sort((a, b) => a.name.localeCompare(b.name))) {
      const name = rel ? `${rel}/${dirent.name}` : dirent.name;
      if (ignored(name) && !keep.includes(name)) continue;
      const full = path.join(dir, name);
      const stat = await fs.lstat(full);
      const common = { mode: stat.mode & 0o7777, mtime: stat.mtime };
      if (stat.isDirectory()) {
        entries.push({ header: { ...common, name: `${name}/`, type: 'directory' } });
        await walk(name);
      } else if (stat.isSymbolicLink()) entries.push({ header: { ...common, name, type: 'symlink', linkname: await fs.readlink(full) } });
      else if (stat.isFile()) entries.push({ header: { ...common, name, type: 'file' }, data: await fs.readFile(full) });
      else throw new CliError('invalid_request', `${full}: a context holds files, directories and symlinks`);
    }
  };
  await walk('');
  return packTar(entries);
}

function summary(build: Build, wallMs: number): string {
  return table([
    ['name', build.name],
    ['build', build.id],
    ['state', build.state],
    ['digest', build.digest ?? '-'],
    ['steps', `${build.steps.length} (${build.stepsRun} run, ${build.stepsCached} cached)`],
    ['time', `${(wallMs / 1000).toFixed(1)} s`],
  ]);
}

export function registerImageBuildCommand(image: Command): void {
  withConnection(
    image
      .command('build')
      .description('build an image from a Dockerfile and a context directory, step by step in builder sandboxes, each step a cached layer; prints a summary')
      .argument('<context>', 'the context directory')
      .requiredOption('--name <name>', "the image's name (what a create's image.base takes)")
      .option('-f, --file <Dockerfile>', 'the Dockerfile (default CONTEXT/Dockerfile)')
      .option('--build-arg <NAME=value...>', 'build arguments')
      .option('--target <stage>', 'the stage to build (default: the last)')
      .option('--allow <host[:port]...>', 'destinations RUN steps may reach (with the gateway\'s ROLLBOX_BUILD_NETWORK_ALLOW)')
      .option('--json', 'print the build record as JSON instead of the summary')
      .option('--progress', 'draw the progress bar even when stderr is not a terminal'),
    'image:build',
  ).action(
    reported(async (contextDir: string, flags: ConnectionFlags & { name: string; file?: string; buildArg?: string[]; target?: string; allow?: string[]; json?: boolean; progress?: boolean }) => {
      const client = new BuildsClient(connect(flags));
      const startedAt = performance.now();
      const dockerfilePath = flags.file ?? path.join(contextDir, 'Dockerfile');
      const dockerfile = await fs.readFile(dockerfilePath, 'utf8').catch(() => {
        throw new CliError('invalid_request', `${dockerfilePath}: no such Dockerfile`);
      });
      const keep = [path.relative(contextDir, dockerfilePath), '.dockerignore'];
      const { context } = await client.uploadContext(await packContext(contextDir, keep));
      const buildArgs = Object.fromEntries((flags.buildArg ?? []).map((kv) => [kv.slice(0, kv.indexOf('=') < 0 ? kv.length : kv.indexOf('=')), kv.includes('=') ? kv.slice(kv.indexOf('=') + 1) : (process.env[kv] ?? '')]));
      const allow = (flags.allow ?? []).map((item) => {
        const [target, port] = item.split(':') as [string, string | undefined];
        return { ...(/^[\d.]+(\/\d+)?$/.test(target) ? { cidr: target } : { host: target }), ...(port ? { ports: [Number(port)] } : {}) };
      });
      const started = await client.startBuild({ name: flags.name, dockerfile, context, buildArgs, network: { allow: allow as never }, ...(flags.target ? { target: flags.target } : {}) });
      const bar = progressBar(flags.name, { enabled: Boolean(flags.progress) || process.stderr.isTTY === true });
      const ended = new Set<number>();
      let output = '';
      const onEvent = (e: BuildStreamEvent) => {
        if (e.kind === 'output') output = e.text ?? '';
        if (e.kind !== 'step' || e.step === undefined) return;
        if (e.state !== 'running') ended.add(e.step);
        const total = e.steps ?? started.steps.length;
        bar.update(ended.size / total, `step ${e.step + 1}/${total} ${e.state}: ${(e.text ?? '').slice(0, 48)}`.padEnd(72));
      };
      let build: Build;
      try {
        build = await client.waitForBuild(started.id, onEvent);
      } finally {
        bar.done();
      }
      await out(flags.json ? `${JSON.stringify(build, null, 2)}\n` : summary(build, performance.now() - startedAt));
      if (build.state === 'failed') {
        if (output) process.stderr.write(`${output.endsWith('\n') ? output : `${output}\n`}`);
        throw new CliError(build.error?.code ?? 'internal', build.error?.message ?? 'the build failed');
      }
    }),
  );
}

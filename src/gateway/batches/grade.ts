import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { RollboxError, type BatchTask, type ExecResult } from '../../api/index.ts';
import type { Principal } from '../../iam/index.ts';
import type { LayerBuilder } from '../../layers/index.ts';
import type { LayerRegistry } from '../../registry/index.ts';
import type { ExecService } from '../exec-service.ts';
import type { FilesService } from '../files-service.ts';
import type { SandboxService } from '../sandbox-service.ts';

/** What a task's steps and its grade work with (a task's deps add its batch's store). */
export interface GradeDeps {
  sandboxes: Pick<SandboxService, 'create' | 'delete' | 'setPolicy' | 'get'>;
  files: Pick<FilesService, 'write' | 'read'>;
  execs: Pick<ExecService, 'exec' | 'commandLog'>;
  layers: Pick<LayerRegistry, 'register'>;
  buildLayer: LayerBuilder;
  /** Cap of what a fresh-sandbox grade collects from the steps' sandbox. */
  collectMaxBytes: number;
  now: () => number;
}

export type Grade = NonNullable<BatchTask['grade']>;

/**
 * Kills every process in the sandbox but the init, this command and its keeper, with the
 * host's busybox (bind-mounted read-only: the steps cannot have replaced it). Rounds, so a
 * process forked meanwhile goes too.
 */
const KILL_LEFTOVERS = ['/.rollbox/busybox', 'sh', '-c', 'for r in 1 2 3; do for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || [ "$p" = $PPID ] || kill -9 "$p" 2>/dev/null; done; done; true'];

/**
 * same-sandbox: a new stage of the steps' sandbox. Every process the steps left is killed,
 * then the grade's hidden paths and network replace the task's (revealing the grader's
 * files), then the grade runs. It runs the image's binaries as the steps left them.
 */
export async function gradeInPlace(deps: GradeDeps, acting: Principal, sandboxId: string, grade: Grade): Promise<ExecResult> {
  // As root: whatever user the steps ran as (the image's, or another an exec named), their processes go.
  await deps.execs.exec(acting, sandboxId, { argv: KILL_LEFTOVERS, env: {}, user: '0', timeoutMs: 30_000, background: false });
  await deps.sandboxes.setPolicy(acting, sandboxId, { hiddenPaths: grade.hiddenPaths, network: grade.network });
  return deps.execs.exec(acting, sandboxId, { argv: grade.argv, cmd: grade.cmd, env: grade.env, cwd: grade.cwd, timeoutMs: grade.timeoutMs, background: false });
}

/**
 * fresh-sandbox: what the steps left at `collect` becomes one layer, stacked between the
 * task's pristine image and the grader's layers: the agent's files win over the image's,
 * the grader's win over the agent's, and nothing else of the steps' sandbox (its binaries,
 * files elsewhere, processes) reaches the grade. Answers the grade and its sandbox's id
 * (the caller deletes it).
 */
export async function gradeInFreshSandbox(
  deps: GradeDeps,
  acting: Principal,
  stepsSandboxId: string,
  task: BatchTask,
  grade: Grade,
  create: (image: BatchTask['image']) => Promise<string>,
): Promise<{ result: ExecResult; sandboxId: string }> {
  const collected = await collect(deps, acting, stepsSandboxId, grade.collect);
  const layers = [...task.image.layers];
  if (collected.length > 0) {
    const pack = tar.pack();
    const built = deps.buildLayer(Readable.from(pack), { maxBytes: deps.collectMaxBytes });
    for (const { header, data } of collected) if (data) pack.entry(header, data);
    else pack.entry(header);
    pack.finalize();
    const { digest, sizeBytes } = await built;
    await deps.layers.register({ digest, sizeBytes, parents: [], createdAt: new Date(deps.now()).toISOString() }, acting.tenant);
    layers.push(digest);
  }
  const sandboxId = await create({ ...task.image, layers: [...layers, ...grade.layers] });
  const result = await deps.execs.exec(acting, sandboxId, { argv: grade.argv, cmd: grade.cmd, env: grade.env, cwd: grade.cwd, timeoutMs: grade.timeoutMs, background: false });
  return { result, sandboxId };
}

type Entry = { header: tar.Header; data?: Buffer };

/**
 * The entries of every collected path, named from the root. The files API answers a
 * directory as a tar of names relative to it (`./`, `./x`) and a file as `./name`. Only
 * regular files, directories and symlinks are kept (a link stays a link, resolved inside
 * the grade sandbox's own root). A path that does not exist adds nothing.
 */
async function collect(deps: GradeDeps, acting: Principal, sandboxId: string, paths: readonly string[]): Promise<Entry[]> {
  const out: Entry[] = [];
  for (const wanted of paths) {
    const read = await deps.files.read(acting, sandboxId, { path: wanted, format: 'tar' }).catch((err: unknown) => {
      if (err instanceof RollboxError && err.code === 'not_found') return undefined;
      throw err;
    });
    if (!read) continue;
    const entries: Entry[] = [];
    const extract = tar.extract();
    extract.end(read.body);
    for await (const entry of extract) {
      const chunks: Buffer[] = [];
      for await (const chunk of entry as AsyncIterable<Buffer>) chunks.push(chunk);
      entries.push({ header: entry.header, data: Buffer.concat(chunks) });
    }
    const isDirectory = entries.some((e) => e.header.type === 'directory' && ['.', './'].includes(e.header.name));
    const base = (isDirectory ? wanted : path.posix.dirname(wanted)).replace(/^\/+/, '');
    for (const { header, data } of entries) {
      const type = header.type ?? 'file';
      const name = path.posix.join(base, header.name);
      if (!['file', 'directory', 'symlink'].includes(type) || name === '.' || name.startsWith('..')) continue;
      out.push(type === 'file' ? { header: { ...header, name, size: data!.length }, data } : { header: { ...header, name } });
    }
  }
  return out;
}

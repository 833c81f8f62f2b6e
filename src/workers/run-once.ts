import { RollboxError, type CreateJob, type Reply, type RunOnce } from '../api/index.ts';
import { keys } from '../registry/index.ts';
import { FILES_TRANSFER_TTL_MS, readInSandbox, writeInSandbox } from './files.ts';
import type { HostContext } from './host-context.ts';

/** Fetched files up to this size (JSON) travel in the reply itself. */
const INLINE_FILES_BYTES = 1 << 20;

/**
 * `POST /v1/run` on the host, once its sandbox runs: the files, the command, the fetched
 * files, then the sandbox discarded, and one answer. One operation instead of a create, a
 * write per file, an exec, a read per fetched file and a delete, each a round trip through
 * Redis and the gateway. Not in the command log: the sandbox is gone with the answer.
 */
export async function runAndDiscard(ctx: HostContext, sandboxId: string, job: CreateJob & { run: RunOnce }): Promise<void> {
  const { runtime } = ctx.deps;
  const { run } = job;
  let reply: Reply;
  try {
    for (const [path, base64] of Object.entries(run.files)) await writeInSandbox(runtime, sandboxId, path, Buffer.from(base64, 'base64'), {});
    const { oomKills, ...outcome } = await runtime.exec(sandboxId, {
      argv: run.argv,
      stdin: run.stdin,
      env: run.env,
      cwd: run.cwd,
      timeoutMs: run.timeoutMs,
      outputCapBytes: ctx.deps.config.execOutputCapBytes,
      holdBackBesteffort: true,
    });
    const files: Record<string, string> = {};
    for (const path of run.fetch) {
      const read = await readInSandbox(runtime, sandboxId, path, 'auto', run.fetchMaxBytes).catch((err: unknown) => {
        if (err instanceof RollboxError && err.code === 'not_found') return undefined;
        throw err;
      });
      if (read && !read.tar) files[path] = read.body.toString('base64');
    }
    const result = { ...outcome, oomKilled: oomKills > 0, commandId: 'run', replayed: false };
    const fetched = JSON.stringify(files);
    if (fetched.length <= INLINE_FILES_BYTES) reply = { kind: 'ran', requestId: job.requestId, nodeId: ctx.nodeId, result, files };
    else {
      // Redis drops a subscriber whose pending messages pass 32 MB: large files go by key, as the files API's do.
      const filesKey = keys.filesTransfer(job.requestId);
      await ctx.deps.redis.set(filesKey, fetched, 'PX', FILES_TRANSFER_TTL_MS);
      reply = { kind: 'ran', requestId: job.requestId, nodeId: ctx.nodeId, result, files: {}, filesKey };
    }
  } catch (err) {
    const error = err instanceof RollboxError ? { code: err.code, message: err.message } : { code: 'internal', message: err instanceof Error ? err.message : String(err) };
    reply = { kind: 'error', requestId: job.requestId, error };
  }
  try {
    await ctx.removeLocal(sandboxId);
    await ctx.deps.registry.transition(sandboxId, 'terminated', { node: ctx.nodeId });
  } catch (err) {
    // The answer goes out all the same; the janitor ends a sandbox whose TTL has passed.
    ctx.log.error({ err, sandboxId }, 'discarding a run sandbox failed');
  }
  await ctx.reply(job.replyTo, reply);
}

import { randomBytes } from 'node:crypto';
import type { Context } from 'hono';
import type { Redis } from 'ioredis';
import type { z } from 'zod';
import { E2bWatchDirRequest, E2bWatcherRequest, RollboxError } from '../../api/index.ts';
import type { ExecEvent, ExecService } from '../exec-service.ts';
import { SANDBOX_BUSYBOX } from '../../workers/runtime/spec.ts';
import { ConnectError, readStreamRequest, readUnary, streamResponse } from './connect.ts';
import { MAX_COMMAND_MS, keepaliveMsOf, resolvePath, timeoutMsOf, type EnvdCall } from './envd-common.ts';

export interface E2bWatchDeps {
  redis: Redis;
  execs: Pick<ExecService, 'startStreaming' | 'commandOutput' | 'signalCommand'>;
}

/** The watcher's first line: its first snapshot is taken, so every later change is reported. */
const READY = 'ready';
const EXIT_NOT_FOUND = 44;
const EXIT_NOT_DIRECTORY = 45;
/** Between two snapshots of the watched tree (each one `find` and one `stat`, forked inside the sandbox). */
const POLL_SECONDS = 0.2;
/** A watcher whose first snapshot takes longer than this (a huge tree) is refused. */
const START_TIMEOUT_MS = 30_000;
/** A polling watcher's cursor outlives the longest sandbox TTL (7 days) by a little. */
const WATCHER_KEY_TTL_SEC = 8 * 24 * 3600;
/** A watcher's commandId in the command log (the E2B process list leaves it out). */
const WATCH_PREFIX = 'e2bwatch.';

const watcherKey = (sandboxId: string, watcherId: string) => `rb:e2b:{${sandboxId}}:watcher:${watcherId}`;

/**
 * The watcher, run inside the sandbox by rollbox's own busybox (every sandbox has it, the
 * image may have no shell or inotify tools): a snapshot of the tree every POLL_SECONDS
 * (`inode|mode|size|mtime|type|path` per entry), and awk turns two snapshots into
 * fsnotify's events, one `TYPE<TAB>name` line each, the name relative to the watched
 * directory as envd gives it: a new path is CREATE (and WRITE when it has bytes, as a
 * create-then-write would show), a path whose inode shows up under another name is RENAME
 * (then CREATE of the new name), a vanished one REMOVE, a file's new size or mtime WRITE,
 * new permissions CHMOD. $1 the directory, $2 `-maxdepth 1` or nothing (recursive).
 * Changes that cancel out within one interval are not seen, and names with a newline are
 * not reported faithfully.
 */
const WATCH_SCRIPT = `B=${SANDBOX_BUSYBOX}
d="$1"
[ -e "$d" ] || { echo "path $d not found" >&2; exit ${EXIT_NOT_FOUND}; }
[ -d "$d" ] || { echo "path $d is not a directory" >&2; exit ${EXIT_NOT_DIRECTORY}; }
r="\${d%/}/"
snap() { $B find "$d" -mindepth 1 $2 -exec $B stat -c '%i|%a|%s|%y|%F|%n' {} + 2>/dev/null; }
prev=$(snap "$@")
echo ${READY}
while $B sleep ${POLL_SECONDS}; do
  [ -d "$d" ] || exit 0
  cur=$(snap "$@")
  [ "$cur" = "$prev" ] && continue
  printf '%s\\n\\001\\n%s\\n' "$prev" "$cur" | $B awk -v r="$r" '
    function rel(p) { return substr(p, length(r) + 1) }
    $0 == "\\001" { now = 1; next }
    $0 == "" { next }
    {
      line = $0
      for (i = 1; i <= 5; i++) { k = index(line, "|"); f[i] = substr(line, 1, k - 1); line = substr(line, k + 1) }
      if (now) { ci[line] = f[1]; cm[line] = f[2]; cs[line] = f[3]; ct[line] = f[4]; ck[line] = f[5] }
      else { pi[line] = f[1]; pm[line] = f[2]; ps[line] = f[3]; pt[line] = f[4]; pk[line] = f[5] }
    }
    END {
      for (p in pi) if (!(p in ci)) gone[pi[p]] = p
      for (p in ci) {
        if (!(p in pi) || ci[p] != pi[p]) {
          if (ci[p] in gone) { print "RENAME\\t" rel(gone[ci[p]]); moved[gone[ci[p]]] = 1; print "CREATE\\t" rel(p); continue }
          print "CREATE\\t" rel(p)
          if (ck[p] == "regular file" && cs[p] > 0) print "WRITE\\t" rel(p)
          continue
        }
        if (cm[p] != pm[p]) print "CHMOD\\t" rel(p)
        if (ck[p] != "directory" && (cs[p] != ps[p] || ct[p] != pt[p])) print "WRITE\\t" rel(p)
      }
      for (p in pi) if (!(p in ci) && !(p in moved)) print "REMOVE\\t" rel(p)
    }'
  prev=$cur
done`;

const EVENT_TYPES = new Set(['CREATE', 'WRITE', 'REMOVE', 'RENAME', 'CHMOD']);

/** envd's FilesystemEvent for each complete line of `text`; the unfinished last line is handed back. */
function parseEvents(text: string): { events: { name: string; type: string }[]; rest: string } {
  const lines = text.split('\n');
  const rest = lines.pop()!;
  const events = [];
  for (const line of lines) {
    const tab = line.indexOf('\t');
    const type = line.slice(0, tab);
    if (tab > 0 && EVENT_TYPES.has(type)) events.push({ name: line.slice(tab + 1), type: `EVENT_TYPE_${type}` });
  }
  return { events, rest };
}

/**
 * envd's directory watching: WatchDir (a stream) and the polling watchers (CreateWatcher,
 * GetWatcherEvents, RemoveWatcher), each a command of the sandbox (commandId
 * `e2bwatch.<id>`) running WATCH_SCRIPT, so paths, symlinks and mounts are the sandbox's own
 * and the watcher runs as the call's user. A polling watcher's cursor in its command's
 * output stream is kept in Redis: any gateway answers GetWatcherEvents.
 */
export function watchService(deps: E2bWatchDeps) {
  const { redis, execs } = deps;

  /** Starts the watcher and waits for its first snapshot; the events after it follow. */
  async function start(call: EnvdCall, request: z.infer<typeof E2bWatchDirRequest>, timeoutMs: number): Promise<{ commandId: string; events: AsyncGenerator<ExecEvent>; pending: string }> {
    const dir = resolvePath(request.path, call.user, await call.sandbox());
    const argv = [SANDBOX_BUSYBOX, 'sh', '-c', WATCH_SCRIPT, 'watch', dir, ...(request.recursive ? [] : ['-maxdepth 1'])];
    const commandId = `${WATCH_PREFIX}${randomBytes(12).toString('hex')}`;
    const run = await call.guard(execs.startStreaming(call.principal, call.sandboxId, { argv, env: {}, user: call.user, timeoutMs, commandId, background: false, stdinOpen: false }));
    const events = run.events;
    let stdout = '';
    let stderr = '';
    const deadline = setTimeout(() => void events.return(undefined), START_TIMEOUT_MS);
    try {
      // Not for-await: leaving that loop would close the events the caller goes on reading.
      for (let next = await events.next(); !next.done; next = await events.next()) {
        const ev = next.value;
        if (ev.event === 'stderr') stderr += ev.data;
        if (ev.event === 'stdout') stdout += ev.data;
        const ready = stdout.indexOf(`${READY}\n`);
        if (ready >= 0) return { commandId, events, pending: stdout.slice(ready + READY.length + 1) };
        if (ev.event === 'exit') {
          const { exitCode } = JSON.parse(ev.data) as { exitCode: number };
          if (exitCode === EXIT_NOT_FOUND) throw new ConnectError('not_found', stderr.trim());
          if (exitCode === EXIT_NOT_DIRECTORY) throw new ConnectError('invalid_argument', stderr.trim());
          throw new ConnectError('internal', `the watcher of ${dir} ended before it started (exit ${exitCode}): ${stderr.trim()}`);
        }
      }
    } catch (err) {
      await stop(call, commandId).catch(() => {});
      throw await call.explain(err);
    } finally {
      clearTimeout(deadline);
    }
    await stop(call, commandId);
    throw new ConnectError('deadline_exceeded', `the watcher of ${dir} took longer than ${START_TIMEOUT_MS} ms to take its first snapshot`);
  }

  /** Ends a watcher's command (one that has ended already is no error). */
  async function stop(call: EnvdCall, commandId: string): Promise<void> {
    await execs.signalCommand(call.principal, call.sandboxId, commandId, 'KILL').catch((err: unknown) => {
      if (!(err instanceof RollboxError && (err.code === 'invalid_state' || err.code === 'not_found'))) throw err;
    });
  }

  async function pollingWatcher(call: EnvdCall, watcherId: string): Promise<{ commandId: string; after: string; rest: string }> {
    const state = await redis.hgetall(watcherKey(call.sandboxId, watcherId));
    if (!state.commandId) throw new ConnectError('not_found', `watcher with id ${watcherId} not found`);
    return { commandId: state.commandId, after: state.after ?? '0', rest: state.rest ?? '' };
  }

  return {
    /**
     * A stream: the start message once the first snapshot is taken, then each event; the
     * stream's end (the client's stop) ends the watcher. Errors travel in the stream's end
     * frame: the SDK reads a streaming call's HTTP error status as `unimplemented`.
     */
    async WatchDir(c: Context, call: EnvdCall): Promise<Response> {
      const request = await readStreamRequest(c, E2bWatchDirRequest);
      const timeoutMs = timeoutMsOf(c);
      // The client's stop closes the connection: the generator, waiting on the next event, hears it here.
      const signal = c.req.raw.signal;
      const closed = new Promise<'closed'>((resolve) => (signal.aborted ? resolve('closed') : signal.addEventListener('abort', () => resolve('closed'), { once: true })));
      async function* messages(): AsyncGenerator<unknown> {
        const watch = await start(call, request, timeoutMs);
        try {
          yield { start: {} };
          let text = watch.pending;
          for (;;) {
            const parsed = parseEvents(text);
            text = parsed.rest;
            for (const event of parsed.events) yield { filesystem: event };
            const next = await Promise.race([watch.events.next(), closed]);
            if (next === 'closed' || next.done || next.value.event === 'exit') return;
            if (next.value.event === 'stdout') text += next.value.data;
          }
        } catch (err) {
          throw await call.explain(err);
        } finally {
          // Killed first: a read still waiting on its output ends with it.
          await stop(call, watch.commandId).catch(() => {});
          await watch.events.return(undefined);
        }
      }
      return streamResponse(c, messages(), { message: { keepalive: {} }, everyMs: keepaliveMsOf(c) });
    },

    async CreateWatcher(c: Context, call: EnvdCall): Promise<Response> {
      const request = await readUnary(c, E2bWatchDirRequest);
      const watch = await start(call, request, MAX_COMMAND_MS);
      await watch.events.return(undefined);
      // The cursor starts at the output's beginning: the lines before READY are no events.
      const key = watcherKey(call.sandboxId, watch.commandId);
      await redis.multi().hset(key, { commandId: watch.commandId, after: '0', rest: '' }).expire(key, WATCHER_KEY_TTL_SEC).exec();
      return c.json({ watcherId: watch.commandId }, 200);
    },

    /** The events since the last call (envd's drain); concurrent calls on one watcher may see an event twice. */
    async GetWatcherEvents(c: Context, call: EnvdCall): Promise<Response> {
      const { watcherId } = await readUnary(c, E2bWatcherRequest);
      const watcher = await pollingWatcher(call, watcherId);
      const output = await call.guard(execs.commandOutput(call.principal, call.sandboxId, watcher.commandId, watcher.after));
      const stdout = output.chunks.filter((chunk) => chunk.stream === 'stdout').map((chunk) => chunk.data).join('');
      const { events, rest } = parseEvents(watcher.rest + stdout);
      await redis.hset(watcherKey(call.sandboxId, watcherId), { after: output.lastId, rest });
      return c.json({ events }, 200);
    },

    async RemoveWatcher(c: Context, call: EnvdCall): Promise<Response> {
      const { watcherId } = await readUnary(c, E2bWatcherRequest);
      const watcher = await pollingWatcher(call, watcherId);
      await call.guard(stop(call, watcher.commandId));
      await redis.del(watcherKey(call.sandboxId, watcherId));
      return c.json({}, 200);
    },
  };
}

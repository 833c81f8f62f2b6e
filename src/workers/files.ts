import type { Redis } from 'ioredis';
import { RollboxError, type NodeOp, type Reply } from '../api/index.ts';
import { SANDBOX_BUSYBOX } from './runtime/spec.ts';
import type { RuntimeRawExecOutcome, SandboxRuntime } from './runtime/types.ts';

/**
 * The files API on a worker host. Every read and write is done by the host's static
 * busybox (bind-mounted read-only at SANDBOX_BUSYBOX in every container), forked by the
 * sandbox's init inside the sandbox: its mount namespace, root, cgroups, capabilities and seccomp. So a
 * path, and every symlink on it, resolves in the sandbox's own root: a link to
 * /etc/shadow or to a host path reaches only the sandbox's file of that name. Nothing
 * here joins a sandbox path to a host directory.
 */

/** Bytes in transit live this long in Redis; the gateway deletes them as soon as it is done. */
export const FILES_TRANSFER_TTL_MS = 120_000;
/** Reading or writing 64 MiB inside a sandbox takes well under a second; this bounds a stuck one. */
const FILES_EXEC_TIMEOUT_MS = 90_000;

type FilesReadOp = Extract<NodeOp, { kind: 'files_read' }>;
type FilesWriteOp = Extract<NodeOp, { kind: 'files_write' }>;

const EXIT_NOT_FOUND = 44;
const EXIT_NOT_FILE = 45;
const EXIT_CANNOT = 46;

const B = SANDBOX_BUSYBOX;
/**
 * $1 path, $2 format. Prints one marker byte, then the content: `f` and the file's bytes,
 * or `t` and a tar (of a directory's contents, or with format=tar of the one file).
 * The kernel's pseudo filesystems are left out: a tar of / skips /proc, /sys, /dev (and
 * the platform's own /.rollbox), and a directory inside them is refused, since their
 * files never end (/dev/zero) or describe the kernel rather than the sandbox's work.
 */
const READ_SCRIPT = `p="$1"
if [ -d "$p" ]; then
  cd "$p" || exit ${EXIT_CANNOT}
  case "$(pwd -P)/" in /proc/*|/sys/*|/dev/*) echo "$p: directories under /proc, /sys and /dev are not archived; read single files" >&2; exit ${EXIT_NOT_FILE};; esac
  if [ "$(pwd -P)" = / ]; then
    set --
    for e in * .[!.]* ..?*; do
      [ -e "$e" ] || [ -L "$e" ] || continue
      case "$e" in proc|sys|dev|.rollbox) continue;; esac
      set -- "$@" "./$e"
    done
    printf t; exec ${B} tar -cf - "$@"
  fi
  printf t; exec ${B} tar -cf - .
fi
[ -e "$p" ] || { echo "$p: no such file or directory" >&2; exit ${EXIT_NOT_FOUND}; }
[ -f "$p" ] || { echo "$p: not a regular file or a directory" >&2; exit ${EXIT_NOT_FILE}; }
if [ "$2" = tar ]; then cd "$(${B} dirname "$p")" || exit ${EXIT_CANNOT}; printf t; exec ${B} tar -cf - "./$(${B} basename "$p")"; fi
printf f; exec ${B} cat "$p"`;

/**
 * $1 path, $2 mode or '', $3 owner or ''. The file's bytes on stdin; parent directories are
 * created. With an owner (a user of the sandbox's own /etc/passwd), the file and the
 * parents made for it become that user's, as E2B's envd writes them.
 */
const WRITE_FILE_SCRIPT = `p="$1"
[ -d "$p" ] && { echo "$p is a directory" >&2; exit ${EXIT_NOT_FILE}; }
d="$(${B} dirname "$p")"
if [ -n "$3" ]; then
  ${B} id -u "$3" >/dev/null 2>&1 || { echo "unable to find user $3" >&2; exit ${EXIT_CANNOT}; }
  top="$d"; while [ ! -e "$top" ]; do new="$top"; top="$(${B} dirname "$top")"; done
fi
${B} mkdir -p "$d" || exit ${EXIT_CANNOT}
${B} cat > "$p" || exit ${EXIT_CANNOT}
[ -z "$2" ] || ${B} chmod "$2" "$p" || exit ${EXIT_CANNOT}
if [ -n "$3" ]; then
  ${B} chown "$3": "$p" || exit ${EXIT_CANNOT}
  [ -z "$new" ] || ${B} chown -R "$3": "$new" || exit ${EXIT_CANNOT}
fi`;

/** $1 directory (created if missing). A tar on stdin, already checked by the gateway. */
const WRITE_TAR_SCRIPT = `p="$1"
if [ -e "$p" ] && [ ! -d "$p" ]; then echo "$p exists and is not a directory" >&2; exit ${EXIT_NOT_FILE}; fi
${B} mkdir -p "$p" && cd "$p" || exit ${EXIT_CANNOT}
exec ${B} tar -xf -`;

interface FilesDeps {
  runtime: SandboxRuntime;
  redis: Redis;
}

export async function readSandboxFiles(deps: FilesDeps, op: FilesReadOp): Promise<Reply> {
  const { tar, body } = await readInSandbox(deps.runtime, op.sandboxId, op.path, op.format, op.maxBytes);
  await deps.redis.set(op.resultKey, body, 'PX', FILES_TRANSFER_TTL_MS);
  return { kind: 'files', requestId: op.requestId, tar, sizeBytes: body.length };
}

export async function writeSandboxFiles(deps: FilesDeps, op: FilesWriteOp): Promise<Reply> {
  const body = await deps.redis.getBuffer(op.bodyKey);
  if (!body) throw new RollboxError('timeout', 'the upload expired before the worker host read it; send it again');
  await writeInSandbox(deps.runtime, op.sandboxId, op.path, body, op.tar ? { tar: true } : { mode: op.mode, owner: op.owner });
  return { kind: 'files', requestId: op.requestId, tar: op.tar, sizeBytes: body.length };
}

/** A file's bytes (`tar: false`), or a tar of a directory (or, format `tar`, of the file). */
export async function readInSandbox(runtime: SandboxRuntime, sandboxId: string, path: string, format: 'auto' | 'tar', maxBytes: number): Promise<{ tar: boolean; body: Buffer }> {
  // One byte more than the cap: the marker.
  const run = await runtime.execRaw(sandboxId, { argv: shell(READ_SCRIPT, path, format), timeoutMs: FILES_EXEC_TIMEOUT_MS, maxStdoutBytes: maxBytes + 1 });
  if (run.overflowed) throw new RollboxError('payload_too_large', `${path} is larger than the files limit of ${maxBytes} bytes`);
  checkExit(run, path);
  return { tar: run.stdout[0] === 't'.charCodeAt(0), body: run.stdout.subarray(1) };
}

/** A file's bytes (parents created), or with `tar` a checked tar extracted into the directory. */
export async function writeInSandbox(runtime: SandboxRuntime, sandboxId: string, path: string, body: Buffer, how: { tar: true } | { mode?: string | undefined; owner?: string | undefined }): Promise<void> {
  const script = 'tar' in how ? shell(WRITE_TAR_SCRIPT, path) : shell(WRITE_FILE_SCRIPT, path, how.mode ?? '', how.owner ?? '');
  const run = await runtime.execRaw(sandboxId, { argv: script, stdin: body, timeoutMs: FILES_EXEC_TIMEOUT_MS, maxStdoutBytes: 64 * 1024 });
  checkExit(run, path);
}

function shell(script: string, ...args: string[]): string[] {
  return [B, 'sh', '-c', script, 'rollbox-files', ...args];
}

function checkExit(run: RuntimeRawExecOutcome, path: string): void {
  if (run.timedOut) throw new RollboxError('timeout', `reading or writing ${path} took longer than ${FILES_EXEC_TIMEOUT_MS} ms`);
  if (run.exitCode === 0) return;
  const why = run.stderr.trim().split('\n').slice(-3).join('; ') || `exit code ${run.exitCode}`;
  if (run.exitCode === EXIT_NOT_FOUND) throw new RollboxError('not_found', why);
  // 255: runc could not start the command at all (the sandbox is going away).
  if (run.exitCode === 255) throw new RollboxError('internal', `files command could not run in the sandbox: ${why}`);
  throw new RollboxError('invalid_request', why);
}

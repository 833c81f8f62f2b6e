import { RollboxError, type FileEntry, type FilesMetaAction, type NodeOp, type Reply } from '../api/index.ts';
import { SANDBOX_BUSYBOX } from './runtime/spec.ts';
import type { SandboxRuntime } from './runtime/types.ts';

/**
 * stat, list, mkdir, move and remove inside a sandbox, by the host's static busybox forked
 * by the sandbox's init (as the files API's reads and writes: see files.ts), so every path
 * resolves in the sandbox's own root. Each entry comes back as four NUL-terminated
 * fields: `rawmode size mtime owner group permissions`, the path, the symlink target, and
 * for a symlink that resolves, `rawmode path` of what it resolves to (absolute, every link
 * on the way followed).
 */

type FilesMetaOp = Extract<NodeOp, { kind: 'files_meta' }>;

const EXIT_NOT_FOUND = 44;
const EXIT_NOT_DIR = 45;
const EXIT_CANNOT = 46;
/** mkdir found a directory already there (not an error: `created: false`). */
const EXIT_EXISTED = 47;
const META_EXEC_TIMEOUT_MS = 30_000;
/** A listing's output cap: about 40,000 entries. */
const MAX_LISTING_BYTES = 8 * 1024 * 1024;

const B = SANDBOX_BUSYBOX;
const EMIT = `emit() { S=$(${B} stat -c '%f %s %Y %U %G %A' -- "$1") || return 0; T=; R=
if [ -L "$1" ]; then T=$(${B} readlink -- "$1"); R=$(${B} readlink -f -- "$1") && R="$(${B} stat -L -c '%f' -- "$1" 2>/dev/null) $R" || R=; fi
printf '%s\\0%s\\0%s\\0%s\\0' "$S" "$1" "$T" "$R"; }
missing() { [ -e "$1" ] || [ -L "$1" ] || { echo "$1: no such file or directory" >&2; exit ${EXIT_NOT_FOUND}; }; }`;

/** $1 path (and $2 depth or destination). */
const SCRIPTS: Record<FilesMetaAction['action'], string> = {
  stat: `${EMIT}
missing "$1"; emit "$1"`,
  list: `${EMIT}
missing "$1"
[ -d "$1" ] || { echo "$1: not a directory" >&2; exit ${EXIT_NOT_DIR}; }
${B} find "$1" -mindepth 1 -maxdepth "$2" | while IFS= read -r e; do emit "$e"; done`,
  mkdir: `${EMIT}
if [ -d "$1" ]; then emit "$1"; exit ${EXIT_EXISTED}; fi
if [ -e "$1" ] || [ -L "$1" ]; then echo "$1 exists and is not a directory" >&2; exit ${EXIT_NOT_DIR}; fi
${B} mkdir -p -- "$1" || exit ${EXIT_CANNOT}
emit "$1"`,
  move: `${EMIT}
missing "$1"
${B} mkdir -p -- "$(${B} dirname -- "$2")" || exit ${EXIT_CANNOT}
${B} mv -f -- "$1" "$2" || exit ${EXIT_CANNOT}
emit "$2"`,
  remove: `[ -e "$1" ] || [ -L "$1" ] || exit ${EXIT_NOT_FOUND}
${B} rm -rf -- "$1" || exit ${EXIT_CANNOT}`,
};

export async function sandboxFilesMeta(runtime: SandboxRuntime, op: FilesMetaOp): Promise<Reply> {
  const { request } = op;
  const args = request.action === 'list' ? [String(request.depth)] : request.action === 'move' ? [request.destination] : [];
  const run = await runtime.execRaw(op.sandboxId, {
    argv: [B, 'sh', '-c', SCRIPTS[request.action], 'rollbox-files', request.path, ...args],
    timeoutMs: META_EXEC_TIMEOUT_MS,
    maxStdoutBytes: MAX_LISTING_BYTES,
  });
  const reply = (entries: FileEntry[], changed: boolean): Reply => ({ kind: 'files_meta', requestId: op.requestId, entries, changed });
  if (run.timedOut) throw new RollboxError('timeout', `${request.action} of ${request.path} took longer than ${META_EXEC_TIMEOUT_MS} ms`);
  if (run.overflowed) throw new RollboxError('payload_too_large', `the listing of ${request.path} is larger than ${MAX_LISTING_BYTES} bytes; list less deep`);
  if (request.action === 'remove' && run.exitCode === EXIT_NOT_FOUND) return reply([], false);
  if (request.action === 'mkdir' && run.exitCode === EXIT_EXISTED) return reply(parseEntries(run.stdout), false);
  if (run.exitCode !== 0) {
    const why = run.stderr.trim().split('\n').slice(-3).join('; ') || `exit code ${run.exitCode}`;
    if (run.exitCode === EXIT_NOT_FOUND) throw new RollboxError('not_found', why);
    if (run.exitCode === 255) throw new RollboxError('internal', `files command could not run in the sandbox: ${why}`);
    throw new RollboxError('invalid_request', why);
  }
  return reply(parseEntries(run.stdout), request.action === 'mkdir' || request.action === 'remove');
}

const TYPES: Record<number, FileEntry['type']> = { 0o100000: 'file', 0o040000: 'directory', 0o120000: 'symlink' };

/** The NUL-separated fields the scripts print, four per entry, as entries (see EMIT). Exported for its unit test. */
export function parseEntries(stdout: Buffer): FileEntry[] {
  const fields = stdout.toString('utf8').split('\0');
  const entries: FileEntry[] = [];
  const typeOf = (mode: number) => TYPES[mode & 0o170000] ?? 'other';
  for (let i = 0; i + 3 < fields.length; i += 4) {
    const [rawMode = '0', size = '0', mtime = '0', owner = '', group = '', permissions = ''] = fields[i]!.split(' ');
    const path = fields[i + 1]!;
    const mode = Number.parseInt(rawMode, 16);
    const target = fields[i + 2]!;
    const resolved = fields[i + 3]!;
    const space = resolved.indexOf(' ');
    const resolvedMode = Number.parseInt(resolved.slice(0, space), 16);
    entries.push({
      name: path.slice(path.lastIndexOf('/') + 1) || '/',
      path,
      type: typeOf(mode),
      sizeBytes: Number(size),
      mode: mode & 0o7777,
      permissions,
      owner,
      group,
      modifiedAt: new Date(Number(mtime) * 1000).toISOString(),
      ...(target ? { symlinkTarget: target } : {}),
      ...(space > 0 ? { resolved: { path: resolved.slice(space + 1), type: typeOf(resolvedMode), mode: resolvedMode & 0o7777 } } : {}),
    });
  }
  return entries;
}

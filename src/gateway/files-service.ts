import type { Redis } from 'ioredis';
import {
  FILES_TAR_TYPE,
  RollboxError,
  newId,
  type FileEntry,
  type FilesMetaAction,
  type FilesReadQuery,
  type FilesWriteQuery,
  type FilesWriteResult,
  type MakeDirResult,
  type RemoveResult,
  type Reply,
  type Sandbox,
} from '../api/index.ts';
import type { Config } from '../config/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import { checkFilesArchive } from '../layers/index.ts';
import { keys, type SandboxRegistry } from '../registry/index.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';

export interface FilesServiceDeps {
  config: Pick<Config, 'files'>;
  redis: Redis;
  registry: SandboxRegistry;
  nodes: NodeRequests;
}

/** The worker's own limit on the command is 90 s; this adds queueing and transfer. */
const FILES_REPLY_TIMEOUT_MS = 120_000;
/** Upload bytes wait in Redis this long for the worker (deleted as soon as it answers). */
const TRANSFER_TTL_MS = 120_000;
const MAX_ARCHIVE_ENTRIES = 200_000;

/**
 * Files in a running sandbox. The bytes travel through one short-lived Redis key per
 * request (gateways and worker hosts share nothing else), capped at `files.maxBytes`;
 * the worker host does the I/O inside the sandbox (see src/workers/files.ts).
 */
export class FilesService {
  constructor(private readonly deps: FilesServiceDeps) {}

  /** A regular file as its bytes, a directory (or anything with format=tar) as a tar. */
  async read(principal: Principal, id: string, query: FilesReadQuery): Promise<{ body: Buffer; tar: boolean }> {
    requireScope(principal, 'sandbox:read');
    const sandbox = await this.runningSandbox(principal, id);
    const requestId = newId('req');
    const resultKey = keys.filesTransfer(requestId);
    try {
      const reply = await this.deps.nodes.sendOp(
        sandbox.node!,
        { kind: 'files_read', sandboxId: id, requestId, path: query.path, format: query.format, maxBytes: this.deps.config.files.maxBytes, resultKey },
        FILES_REPLY_TIMEOUT_MS,
      );
      const result = filesReply(reply);
      const body = await this.deps.redis.getBuffer(resultKey);
      if (!body) throw new RollboxError('internal', `the bytes of ${query.path} expired before the gateway read them`);
      return { body, tar: result.tar };
    } finally {
      await this.deps.redis.del(resultKey);
    }
  }

  /** Writes `body` as the file at path, or extracts it (a tar) into the directory at path. */
  async write(principal: Principal, id: string, query: FilesWriteQuery, body: Buffer, contentType: string | undefined): Promise<FilesWriteResult> {
    requireScope(principal, 'sandbox:exec');
    const { maxBytes } = this.deps.config.files;
    if (body.length > maxBytes) throw new RollboxError('payload_too_large', `body is larger than the files limit of ${maxBytes} bytes`);
    const tar = contentType?.split(';')[0]!.trim().toLowerCase() === FILES_TAR_TYPE;
    if (tar && (query.mode || query.owner)) throw new RollboxError('invalid_request', 'mode and owner apply to a single file; tar entries carry their own');
    const sandbox = await this.runningSandbox(principal, id);
    const bytes = tar ? await checkFilesArchive(body, { maxEntries: MAX_ARCHIVE_ENTRIES }) : body;
    const requestId = newId('req');
    const bodyKey = keys.filesTransfer(requestId);
    try {
      await this.deps.redis.set(bodyKey, bytes, 'PX', TRANSFER_TTL_MS);
      const reply = await this.deps.nodes.sendOp(sandbox.node!, { kind: 'files_write', sandboxId: id, requestId, path: query.path, tar, mode: query.mode, owner: query.owner, bodyKey }, FILES_REPLY_TIMEOUT_MS);
      filesReply(reply);
      return { path: query.path, kind: tar ? 'directory' : 'file', sizeBytes: body.length };
    } finally {
      await this.deps.redis.del(bodyKey);
    }
  }

  async stat(principal: Principal, id: string, path: string): Promise<FileEntry> {
    requireScope(principal, 'sandbox:read');
    return (await this.meta(principal, id, { action: 'stat', path })).entries[0]!;
  }

  async list(principal: Principal, id: string, path: string, depth: number): Promise<FileEntry[]> {
    requireScope(principal, 'sandbox:read');
    return (await this.meta(principal, id, { action: 'list', path, depth })).entries;
  }

  /** `mkdir -p`; an existing directory answers `created: false`. */
  async makeDir(principal: Principal, id: string, path: string): Promise<MakeDirResult> {
    requireScope(principal, 'sandbox:exec');
    const { entries, changed } = await this.meta(principal, id, { action: 'mkdir', path });
    return { entry: entries[0]!, created: changed };
  }

  /** Renames (or moves across directories), replacing a file at destination; its parents are created. */
  async move(principal: Principal, id: string, source: string, destination: string): Promise<FileEntry> {
    requireScope(principal, 'sandbox:exec');
    return (await this.meta(principal, id, { action: 'move', path: source, destination })).entries[0]!;
  }

  /** `rm -rf`: a file or a whole directory; nothing there is `removed: false`. */
  async remove(principal: Principal, id: string, path: string): Promise<RemoveResult> {
    requireScope(principal, 'sandbox:exec');
    return { path, removed: (await this.meta(principal, id, { action: 'remove', path })).changed };
  }

  private async meta(principal: Principal, id: string, request: FilesMetaAction): Promise<Extract<Reply, { kind: 'files_meta' }>> {
    const sandbox = await this.runningSandbox(principal, id);
    const reply = await this.deps.nodes.sendOp(sandbox.node!, { kind: 'files_meta', sandboxId: id, requestId: newId('req'), request }, FILES_REPLY_TIMEOUT_MS);
    if (reply.kind === 'error') throw toRollboxError(reply.error);
    if (reply.kind !== 'files_meta' || (request.action !== 'list' && request.action !== 'remove' && reply.entries.length !== 1)) throw new RollboxError('internal', `unexpected reply ${reply.kind} to ${request.action}`);
    return reply;
  }

  /** Files move only in a running sandbox: a frozen one cannot run the copy, a hibernated one has no container. */
  private async runningSandbox(principal: Principal, id: string): Promise<Sandbox> {
    const sandbox = await this.deps.registry.getOwned(id, principal.tenant);
    if (sandbox.state === 'running') return sandbox;
    const hint = sandbox.state === 'paused' || sandbox.state === 'hibernated' ? '; resume it first' : '';
    throw new RollboxError('invalid_state', `sandbox ${id} is ${sandbox.state}, not running${hint}`);
  }
}

function filesReply(reply: Reply): Extract<Reply, { kind: 'files' }> {
  if (reply.kind === 'error') throw toRollboxError(reply.error);
  if (reply.kind !== 'files') throw new RollboxError('internal', `unexpected reply ${reply.kind}`);
  return reply;
}

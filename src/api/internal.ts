import { z } from 'zod';
import { ExecResult, PtySize } from './exec.ts';
import { FileEntry, FilesMetaAction } from './files.ts';
import { NetworkPolicy } from './sandbox.ts';

/**
 * Messages between gateways and worker hosts (BullMQ job data and replies). Not part of
 * the public HTTP API, but defined here so both sides parse the same shapes.
 */
/**
 * `POST /v1/run` in one operation: once the sandbox runs, its host writes the files, runs
 * the command, reads the fetched files and discards the sandbox, then answers `ran`.
 */
export const RunOnce = z.object({
  argv: z.array(z.string()),
  stdin: z.string().optional(),
  env: z.record(z.string(), z.string()),
  cwd: z.string(),
  timeoutMs: z.number().int(),
  /** Absolute path -> base64 content, written before the command. */
  files: z.record(z.string(), z.string()),
  /** Absolute paths read back after it (regular files; a missing one is left out). */
  fetch: z.array(z.string()),
  fetchMaxBytes: z.number().int(),
});
export type RunOnce = z.infer<typeof RunOnce>;

export const CreateJob = z.object({
  sandboxId: z.string(),
  /** Placement attempt: the BullMQ job id is `<sandboxId>.<attempt>`, so a retry of one attempt is idempotent. */
  attempt: z.number().int(),
  requestId: z.string(),
  replyTo: z.string(),
  run: RunOnce.optional(),
});
export type CreateJob = z.infer<typeof CreateJob>;

export const ExecOp = z.object({
  kind: z.literal('exec'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  commandId: z.string(),
  argv: z.array(z.string()),
  stdin: z.string().optional(),
  env: z.record(z.string(), z.string()),
  cwd: z.string().optional(),
  /** As given to exec; none: the sandbox's user (its host knows it), else root. */
  user: z.string().optional(),
  timeoutMs: z.number().int(),
  /** Also append output to the command's output stream as it is produced. */
  stream: z.boolean().default(false),
  /** Nobody waits on the result (a background command): it does not hold besteffort sandboxes back. */
  background: z.boolean().default(false),
  /** Stdin stays open after `stdin` for CommandStdinOp. */
  stdinOpen: z.boolean().optional(),
  /** Run on a terminal of this size (CommandResizeOp changes it). */
  pty: PtySize.optional(),
});
/** A signal to a running command's process group. */
export const CommandSignalOp = z.object({
  kind: z.literal('signal'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  commandId: z.string(),
  signo: z.number().int().min(1).max(64),
});
/** A running pty command's new window size. */
export const CommandResizeOp = z.object({
  kind: z.literal('resize'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  commandId: z.string(),
  size: PtySize,
});
/** Stdin for a running command started with `stdinOpen`. */
export const CommandStdinOp = z.object({
  kind: z.literal('stdin'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  commandId: z.string(),
  data: z.string(),
  eof: z.boolean(),
});
export const DestroyOp = z.object({
  kind: z.literal('destroy'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
});
export const FreezeOp = z.object({
  /** hibernate: pack the writable layer into a layer, then stop the container (memory freed). */
  kind: z.enum(['pause', 'resume', 'hibernate']),
  /** A pause's mode: `swap` also pages the frozen sandbox's memory out (absent: freeze). */
  mode: z.enum(['freeze', 'swap']).optional(),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
});
export const SnapshotOp = z.object({
  kind: z.literal('snapshot'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  exclude: z.array(z.string()),
});
/**
 * A fork point of a sandbox this host runs (runtime makeForkPoint): made, packed into a
 * layer for children elsewhere (answered as a snapshot), or removed once the fork is done.
 * `save`: a sandbox saved whole (a microVM, runtime forkWhole) into the layer store's fork
 * image of that id, processes and all, for children restored from it on any host sharing
 * the store; `childrenNic`: the children want a network device.
 */
export const ForkPointOp = z.object({
  kind: z.literal('fork_point'),
  action: z.enum(['make', 'pack', 'remove', 'save']),
  sandboxId: z.string(),
  forkPointId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  childrenNic: z.boolean().optional(),
});
/** Files API: bytes travel through a short-lived Redis key, the I/O runs inside the sandbox. */
export const FilesReadOp = z.object({
  kind: z.literal('files_read'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  path: z.string(),
  format: z.enum(['auto', 'tar']),
  maxBytes: z.number().int(),
  /** Where the worker puts what it read. */
  resultKey: z.string(),
});
export const FilesWriteOp = z.object({
  kind: z.literal('files_write'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  path: z.string(),
  /** A (checked) tar to extract into the directory at path, or the file's bytes. */
  tar: z.boolean(),
  mode: z.string().optional(),
  /** The file (and the parents made for it) are then owned by this user of the sandbox (E2B writes as the user it names). */
  owner: z.string().optional(),
  /** Where the gateway put the bytes. */
  bodyKey: z.string(),
});
/** stat, list, mkdir, move, remove: small answers, straight in the reply. */
export const FilesMetaOp = z.object({
  kind: z.literal('files_meta'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  request: FilesMetaAction,
});
/** A new TTL: the sandbox's host moves its timer, then records it. */
export const TtlOp = z.object({
  kind: z.literal('ttl'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  expiresAt: z.string(),
});
/** A task stage change: the worker applies it, then records it in the registry. */
export const PolicyOp = z.object({
  kind: z.literal('policy'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
  network: NetworkPolicy.optional(),
  hiddenPaths: z.array(z.string()).optional(),
});
/** One sample of the sandbox's resource use, read from its cgroups and its disk. */
export const MetricsOp = z.object({
  kind: z.literal('metrics'),
  sandboxId: z.string(),
  requestId: z.string(),
  replyTo: z.string(),
});
export const NodeOp = z.discriminatedUnion('kind', [ExecOp, DestroyOp, FreezeOp, SnapshotOp, ForkPointOp, FilesReadOp, FilesWriteOp, FilesMetaOp, TtlOp, PolicyOp, CommandSignalOp, CommandStdinOp, CommandResizeOp, MetricsOp]);
export type NodeOp = z.infer<typeof NodeOp>;

/** A sandbox's resource use as its host reads it: CPU over the window given, memory now, its disk now. */
export const RuntimeMetrics = z.object({
  atMs: z.number(),
  /** CPU time the sandbox used over `windowMs` (all its cores together). */
  cpuUsedMs: z.number(),
  windowMs: z.number(),
  memoryUsedBytes: z.number(),
  memoryCacheBytes: z.number(),
  diskUsedBytes: z.number(),
  diskTotalBytes: z.number(),
});
export type RuntimeMetrics = z.infer<typeof RuntimeMetrics>;

const ReplyError = z.object({ code: z.string(), message: z.string(), retryAfterSeconds: z.number().optional() });

export const Reply = z.discriminatedUnion('kind', [
  z.object({ kind: z.literal('created'), requestId: z.string(), nodeId: z.string() }),
  /** A create with `run`: the command's result and fetched files; the sandbox is gone. */
  /** `filesKey`: the fetched files were too large for a reply (pub/sub) and wait in this Redis key instead, as JSON. */
  z.object({ kind: z.literal('ran'), requestId: z.string(), nodeId: z.string(), result: ExecResult, files: z.record(z.string(), z.string()), filesKey: z.string().optional() }),
  z.object({ kind: z.literal('refused'), requestId: z.string(), nodeId: z.string(), reason: z.string() }),
  /** workerMs: from the worker host taking the op to sending this reply (the Server-Timing `worker` entry). */
  z.object({ kind: z.literal('exec'), requestId: z.string(), result: ExecResult, workerMs: z.number().optional() }),
  z.object({ kind: z.literal('done'), requestId: z.string() }),
  /** frozenMs: how long the sandbox was frozen while its writable layer was packed. */
  z.object({ kind: z.literal('snapshot'), requestId: z.string(), digest: z.string(), sizeBytes: z.number(), frozenMs: z.number().optional() }),
  /**
   * A fork point made (`cloned`), or not where the host cannot clone disks; frozenMs: how long
   * the sandbox was frozen for it. `saved`: the sandbox was saved whole (action save), with
   * `detachedCommands` running in it then (each child keeps their processes, detached).
   */
  z.object({ kind: z.literal('fork_point'), requestId: z.string(), cloned: z.boolean(), frozenMs: z.number().optional(), saved: z.boolean().optional(), detachedCommands: z.array(z.string()).optional() }),
  z.object({ kind: z.literal('files'), requestId: z.string(), tar: z.boolean(), sizeBytes: z.number() }),
  /** files_meta: the entries it found or made; `changed`: mkdir created, remove removed. */
  z.object({ kind: z.literal('files_meta'), requestId: z.string(), entries: z.array(FileEntry), changed: z.boolean() }),
  z.object({ kind: z.literal('error'), requestId: z.string(), error: ReplyError }),
  z.object({ kind: z.literal('metrics'), requestId: z.string(), metrics: RuntimeMetrics }),
]);
export type Reply = z.infer<typeof Reply>;
/** What a create with `run` answers: the command's result and the fetched files. */
export type Ran = Pick<Extract<Reply, { kind: 'ran' }>, 'result' | 'files' | 'filesKey'>;

import { z } from 'zod';

/**
 * The E2B surface's payloads, as the official `e2b` SDK sends them (docs/e2b.md). Control
 * plane bodies are E2B's REST JSON; envd bodies are the proto3 JSON of its Connect RPCs
 * (lowerCamelCase, bytes as base64, int64 as strings, enums by name). Keys this surface
 * does not use (secure, network, mcp, autoResume...) are accepted and ignored, as a newer
 * SDK adds them.
 */

/** E2B's own key shape; the SDK refuses any other before it sends a request. */
export const E2B_API_KEY_PATTERN = /^e2b_[0-9a-f]{40}$/;

export const E2bNewSandbox = z.object({
  templateID: z.string().max(256).optional(),
  /** Seconds; E2B's default 300. */
  timeout: z.number().int().min(1).max(7 * 24 * 3600).optional(),
  metadata: z.record(z.string(), z.string()).optional(),
  envVars: z.record(z.string(), z.string()).optional(),
  /** `lifecycle.onTimeout: 'pause'`: paused at its timeout, not killed; `autoPauseMemory: false` pauses without memory (rollbox: hibernate). */
  autoPause: z.boolean().optional(),
  autoPauseMemory: z.boolean().optional(),
  /** `lifecycle.autoResume`: a call into the paused sandbox (commands, files) resumes it first. */
  autoResume: z.object({ enabled: z.boolean() }).optional(),
  allow_internet_access: z.boolean().optional(),
  network: z
    .object({
      allowPublicTraffic: z.boolean().optional(),
      allowOut: z.array(z.string().max(253)).max(256).optional(),
      denyOut: z.array(z.string().max(253)).max(256).optional(),
    })
    .optional(),
});
export type E2bNewSandbox = z.infer<typeof E2bNewSandbox>;

export const E2bTimeoutBody = z.object({ timeout: z.number().int().min(0).max(7 * 24 * 3600).optional() });
/** `memory: false`: drop memory (rollbox hibernates); absent or true: keep it (the freezer). */
export const E2bPauseBody = z.object({ memory: z.boolean().optional() });

export const E2bListQuery = z.object({
  /** `k=v&k2=v2`, each key and value URI-encoded once more (the SDK's paginator). */
  metadata: z.string().max(8192).optional(),
  /** Comma-separated: running, paused. */
  state: z.string().max(64).optional(),
  limit: z.coerce.number().int().min(1).max(1000).default(100),
  nextToken: z.string().max(64).optional(),
  /** Only sandboxes started after this instant (RFC 3339). */
  startedAfter: z.iso.datetime({ offset: true }).optional(),
  /** Only sandboxes of this template. */
  template: z.string().max(256).optional(),
  /** By start time, over the whole result (not within a page); E2B's default is newest first. */
  order: z.enum(['asc', 'desc']).optional(),
});

/** envd's `ProcessSelector`: a oneof of pid and tag. */
export const E2bProcessSelector = z.union([z.object({ pid: z.number().int().min(1) }), z.object({ tag: z.string().min(1).max(256) })]);

export const E2bStartRequest = z.object({
  process: z.object({
    cmd: z.string().min(1).max(4096),
    args: z.array(z.string().max(262_144)).max(4096).default([]),
    envs: z.record(z.string(), z.string()).default({}),
    cwd: z.string().max(4096).optional(),
  }),
  /** Run on a terminal of this size (envd's `PTY`); its output comes as `pty` data. */
  pty: z.object({ size: z.object({ cols: z.number().int().min(1).max(1000), rows: z.number().int().min(1).max(1000) }) }).optional(),
  tag: z.string().max(256).optional(),
  stdin: z.boolean().optional(),
});
export type E2bStartRequest = z.infer<typeof E2bStartRequest>;

export const E2bConnectRequest = z.object({ process: E2bProcessSelector });
/** `signal`: by name (SIGNAL_SIGKILL, SIGNAL_SIGTERM) or number, as proto3 JSON allows. */
export const E2bSendSignalRequest = z.object({ process: E2bProcessSelector, signal: z.union([z.enum(['SIGNAL_SIGKILL', 'SIGNAL_SIGTERM']), z.literal(9), z.literal(15)]) });
/** `process.Process/SendInput`: stdin or pty input bytes (proto3 JSON: base64). */
export const E2bSendInputRequest = z.object({ process: E2bProcessSelector, input: z.object({ stdin: z.string().max(1_400_000).optional(), pty: z.string().max(1_400_000).optional() }) });
/** `process.Process/Update`: a pty's new size (without one, nothing changes). */
export const E2bUpdateRequest = z.object({ process: E2bProcessSelector, pty: E2bStartRequest.shape.pty });
/** `process.Process/StreamInput`'s messages: start (which process), then data, with keepalives between. */
export const E2bStreamInputRequest = z.object({
  start: z.object({ process: E2bProcessSelector }).optional(),
  data: z.object({ input: z.object({ stdin: z.string().max(1_400_000).optional(), pty: z.string().max(1_400_000).optional() }) }).optional(),
  keepalive: z.object({}).optional(),
});
/** `process.Process/CloseStdin`. */
export const E2bCloseStdinRequest = z.object({ process: E2bProcessSelector });
/** `process.Process/List` takes an empty message. */
export const E2bListRequest = z.object({});

export const E2bPathRequest = z.object({ path: z.string().min(1).max(4096) });
export const E2bListDirRequest = z.object({ path: z.string().min(1).max(4096), depth: z.number().int().min(0).max(32).optional() });
export const E2bMoveRequest = z.object({ source: z.string().min(1).max(4096), destination: z.string().min(1).max(4096) });
/** `filesystem.Filesystem/WatchDir` and `CreateWatcher` (entry info and network mounts are envd 0.6.3+, which rollbox does not announce). */
export const E2bWatchDirRequest = z.object({ path: z.string().min(1).max(4096), recursive: z.boolean().optional(), includeEntry: z.boolean().optional(), allowNetworkMounts: z.boolean().optional() });
/** `GetWatcherEvents` and `RemoveWatcher`. */
export const E2bWatcherRequest = z.object({ watcherId: z.string().min(1).max(128) });

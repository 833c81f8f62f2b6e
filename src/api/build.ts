import { z } from 'zod';
import { ErrorBody } from './common.ts';
import { ImageName } from './image.ts';
import { CreateSandboxRequest, LayerDigest, NetworkAllowRule, Resources } from './sandbox.ts';

/** What an uploaded build context answers: its digest names it in a build (kept for ROLLBOX_BUILD_CONTEXT_TTL_MS). */
export const BuildContext = z.object({
  context: LayerDigest,
  sizeBytes: z.number().int(),
  /** Regular files, directories and symlinks it holds. */
  entries: z.number().int(),
});
export type BuildContext = z.infer<typeof BuildContext>;

export const BUILD_STEP_TIMEOUT_MAX_MS = 3600_000;

/**
 * `POST /v1/images/builds`: a Dockerfile (its text, or a path inside the context) or a list
 * of steps (Dockerfile instructions, one each), the context it copies from, the image's name.
 */
export const BuildRequest = z
  .strictObject({
    name: ImageName,
    dockerfile: z.string().min(1).max(1024 * 1024).optional(),
    /** The Dockerfile inside the context (default `Dockerfile` when neither `dockerfile` nor `steps` is given). */
    dockerfilePath: z.string().min(1).max(4096).optional(),
    /** Dockerfile instructions, one a step (`FROM busybox`, `RUN make`, ...): the same as a Dockerfile of these lines. */
    steps: z.array(z.string().min(1).max(64 * 1024)).min(1).max(1000).optional(),
    /** An uploaded context's digest (`POST /v1/images/builds/contexts`); none: COPY and ADD have nothing to copy from. */
    context: LayerDigest.optional(),
    buildArgs: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string().max(32_768)).default({}),
    /** Destinations RUN steps may reach, with those of ROLLBOX_BUILD_NETWORK_ALLOW; none in all: RUN has no network. */
    network: z.strictObject({ allow: z.array(NetworkAllowRule).max(256).default([]) }).default({ allow: [] }),
    /** The stage to build (default: the last). */
    target: z.string().min(1).max(128).optional(),
    /** Resources of each builder sandbox (defaults as a create's). */
    resources: Resources.optional(),
    stepTimeoutMs: z.number().int().min(1000).max(BUILD_STEP_TIMEOUT_MAX_MS).default(600_000),
    /** Paths (reference answers, a task's solution) left out of every layer the build stores: later steps and the image's sandboxes never see them. */
    referencePaths: z.array(CreateSandboxRequest.shape.workdir.unwrap()).max(64).default([]),
  })
  .refine((r) => [r.dockerfile, r.steps].filter((x) => x !== undefined).length <= 1 && !(r.dockerfilePath && (r.dockerfile || r.steps)), 'give one of dockerfile, dockerfilePath and steps');
export type BuildRequest = z.infer<typeof BuildRequest>;

/** `cached`: its layer was found stored, nothing ran; `done`: it ran (or only changed the config). */
export const BuildStepState = z.enum(['pending', 'running', 'cached', 'done', 'failed', 'skipped']);
export type BuildStepState = z.infer<typeof BuildStepState>;

export const BuildStep = z.object({
  /** Line in the Dockerfile (1-based) where the instruction starts. */
  line: z.number().int(),
  stage: z.string(),
  /** The instruction as written (continuations joined). */
  text: z.string(),
  state: BuildStepState,
  durationMs: z.number().optional(),
  /** The layer it made or found. */
  layer: LayerDigest.optional(),
});
export type BuildStep = z.infer<typeof BuildStep>;

export const BuildState = z.enum(['queued', 'building', 'ready', 'failed']);
export type BuildState = z.infer<typeof BuildState>;

/** A build as `GET /v1/images/builds/:id` shows it. */
export const Build = z.object({
  id: z.string(),
  tenant: z.string(),
  name: ImageName,
  state: BuildState,
  createdAt: z.string(),
  startedAt: z.string().optional(),
  finishedAt: z.string().optional(),
  steps: z.array(BuildStep),
  /** Steps that ran a builder sandbox (the rest were cached or only changed the config). */
  stepsRun: z.number().int().default(0),
  stepsCached: z.number().int().default(0),
  error: ErrorBody.shape.error.optional(),
  /** `failed` at a RUN: what it printed (the end of it) and its exit code. */
  failedStep: z.object({ line: z.number().int(), text: z.string(), exitCode: z.number().int().nullable(), output: z.string() }).optional(),
  /** The image made (`ready`). */
  digest: LayerDigest.optional(),
});
export type Build = z.infer<typeof Build>;

/** One line of a build's log (the SSE stream's events): a step began or ended, or the build ended. */
export const BuildLogEvent = z.object({
  seq: z.number().int(),
  kind: z.enum(['step', 'output', 'end']),
  /** Index into `steps`. */
  step: z.number().int().optional(),
  state: z.union([BuildStepState, BuildState]).optional(),
  text: z.string().optional(),
});
export type BuildLogEvent = z.infer<typeof BuildLogEvent>;

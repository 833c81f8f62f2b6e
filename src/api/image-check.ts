import { z } from 'zod';
import { BatchGrade, BatchStep, BatchTask, StepResult, TaskStatus } from './batch.ts';
import { CreateSandboxRequest } from './sandbox.ts';

/**
 * `POST /v1/images/:name/check`: an image's environment checked before training uses it
 * (the seed's "environment correctness"): the untouched task must fail its grade and the
 * task with the reference solution applied must pass it, each graded as a batch grades (a
 * fresh sandbox by default). The reference solution travels in this request only: it is never
 * part of the image (a build leaves `referencePaths` out of every layer it stores).
 */
export const ImageCheckRequest = z.strictObject({
  /** Run first in both sandboxes (set the task up); none: the image as it is. */
  setup: z.array(BatchStep).max(100).default([]),
  /** The reference solution: written and run after the setup, in the `reference` sandbox only. */
  reference: z
    .strictObject({
      /** Path (absolute, or under workdir) -> base64 content. */
      files: BatchTask.shape.files,
      steps: z.array(BatchStep).max(100).default([]),
    })
    .refine((r) => r.steps.length > 0 || Object.keys(r.files).length > 0, 'a reference solution needs files, steps, or both'),
  grade: BatchGrade,
  resources: CreateSandboxRequest.shape.resources,
  workdir: CreateSandboxRequest.shape.workdir,
});
export type ImageCheckRequest = z.infer<typeof ImageCheckRequest>;

/** `checking` while its two runs go; then `validated` (untouched failed, reference passed) or `invalid`. */
export const ImageCheckState = z.enum(['checking', 'validated', 'invalid']);
export type ImageCheckState = z.infer<typeof ImageCheckState>;

/** One of a check's two runs, as its batch task ended. */
export const ImageCheckRun = z.object({
  status: TaskStatus,
  /** The grade: `passed` decides (the untouched run must not pass; the reference run must). */
  grade: StepResult.extend({ passed: z.boolean() }).optional(),
  error: z.object({ code: z.string(), message: z.string() }).optional(),
});
export type ImageCheckRun = z.infer<typeof ImageCheckRun>;

/** An image's check: for the image's content (`imageDigest`) as it was when checked; a new image under the name needs a new check. */
export const ImageCheck = z.object({
  image: z.string(),
  imageDigest: z.string(),
  state: ImageCheckState,
  /** The batch that runs it (tasks `untouched` and `reference`), readable as any batch of the tenant's. */
  batchId: z.string(),
  startedAt: z.string(),
  endedAt: z.string().optional(),
  untouched: ImageCheckRun.optional(),
  reference: ImageCheckRun.optional(),
  /** `invalid`: which run did not do what it must. */
  reason: z.string().optional(),
});
export type ImageCheck = z.infer<typeof ImageCheck>;

import type { Redis } from 'ioredis';
import { BatchTask, RollboxError, TERMINAL_BATCH_STATES, type Batch, type BatchResultLine, type CreateBatchRequest, type ImageCheck, type ImageCheckRequest, type ImageCheckRun } from '../api/index.ts';
import { readerOf, requireScope, type Principal } from '../iam/index.ts';
import { keys, type ImageRegistry } from '../registry/index.ts';

export interface ImageCheckDeps {
  redis: Pick<Redis, 'hget' | 'hset'>;
  images: Pick<ImageRegistry, 'find' | 'getAt'>;
  /** The check's two runs are a batch of the caller's tenant. */
  batches: {
    submit(principal: Principal, request: CreateBatchRequest): Promise<Batch>;
    results(principal: Principal, id: string, after: string | undefined, limit: number, waitMs: number): Promise<{ lines: BatchResultLine[]; batch: Batch }>;
  };
  now: () => number;
}

/**
 * Image checks (issue 42, the seed's "environment correctness is training-data quality"):
 * before training uses an environment, its untouched task must fail the grade and the task
 * with the reference solution must pass it. A check runs as a batch of two tasks of the
 * caller's tenant (`untouched`, `reference`), graded as batches grade; the check's state is
 * settled from that batch when it is next read. A check is kept per image content (the
 * image's digest): an image built again differently under the same name is unchecked.
 * Scope `image:build`: the accounts that build and check environments are not the ones
 * whose agents train in them.
 */
export class ImageChecks {
  constructor(private readonly deps: ImageCheckDeps) {}

  async start(principal: Principal, name: string, request: ImageCheckRequest): Promise<ImageCheck> {
    requireScope(principal, 'image:build');
    const { field, digest } = await this.imageOf(principal, name);
    const base = { image: { base: name }, ...(request.resources ? { resources: request.resources } : {}), ...(request.workdir ? { workdir: request.workdir } : {}), grade: request.grade };
    // With no setup the untouched task still needs a step: one that changes nothing.
    const setup = request.setup.length > 0 ? request.setup : [{ cmd: 'true' }];
    const tasks = [
      BatchTask.parse({ customId: 'untouched', ...base, steps: setup }),
      BatchTask.parse({ customId: 'reference', ...base, files: request.reference.files, steps: request.reference.steps.length > 0 ? [...request.setup, ...request.reference.steps] : setup }),
    ];
    const batch = await this.deps.batches.submit(asBatchSubmitter(principal), {
      tasks,
      maxConcurrency: 2,
      maxAttempts: 3,
      completionWindowSeconds: 86_400,
      class: 'besteffort',
      metadata: { imageCheck: name },
    });
    const check: ImageCheck = { image: name, imageDigest: digest, state: 'checking', batchId: batch.id, startedAt: new Date(this.deps.now()).toISOString() };
    await this.deps.redis.hset(keys.imageChecks, field, JSON.stringify(check));
    return check;
  }

  /** The check of the image `name` stands for now (settled if its batch has ended), or undefined when its content was never checked. */
  async get(principal: Principal, name: string): Promise<ImageCheck | undefined> {
    const { field } = await this.imageOf(principal, name);
    const json = await this.deps.redis.hget(keys.imageChecks, field);
    if (!json) return undefined;
    const check = JSON.parse(json) as ImageCheck;
    return check.state === 'checking' ? this.settle(principal, field, check) : check;
  }

  /** Refuses (`invalid_state`) unless every image the tasks name passed its check. */
  async requireValidated(principal: Principal, tasks: readonly Pick<BatchTask, 'image'>[]): Promise<void> {
    const names = new Set(tasks.map((t) => t.image.base ?? t.image.ref ?? 'busybox'));
    for (const name of names) {
      const check = await this.get(principal, name);
      if (check?.state !== 'validated') {
        const why = !check ? 'it has no check (POST /v1/images/:name/check)' : check.state === 'checking' ? 'its check is still running' : `its check found it invalid: ${check.reason}`;
        throw new RollboxError('invalid_state', `the batch requires validated images, and image ${name} is not validated: ${why}`);
      }
    }
  }

  private async imageOf(principal: Principal, name: string): Promise<{ field: string; digest: string }> {
    const found = await this.deps.images.find(readerOf(principal), name);
    const image = found && (await this.deps.images.getAt(found.key));
    if (!found || !image) throw new RollboxError('not_found', `image ${name} not found`);
    return { field: `${found.key}@${image.digest}`, digest: image.digest };
  }

  private async settle(principal: Principal, field: string, check: ImageCheck): Promise<ImageCheck> {
    const { lines, batch } = await this.deps.batches.results(asBatchSubmitter(principal), check.batchId, undefined, 10, 0);
    if (!TERMINAL_BATCH_STATES.includes(batch.state)) return check;
    const runOf = (customId: string): ImageCheckRun | undefined => {
      const line = lines.find((l) => l.customId === customId);
      return line && { status: line.status, ...(line.grade ? { grade: { ...line.grade } } : {}), ...(line.error ? { error: line.error } : {}) };
    };
    const untouched = runOf('untouched');
    const reference = runOf('reference');
    const reason = !reference?.grade
      ? `the reference run ended ${reference?.status ?? 'without a result'} before its grade${reference?.error ? ` (${reference.error.code}: ${reference.error.message})` : ''}`
      : !reference.grade.passed
        ? `the reference solution fails the grade (exit ${reference.grade.exitCode})`
        : !untouched?.grade
          ? `the untouched run ended ${untouched?.status ?? 'without a result'} before its grade`
          : untouched.grade.passed
            ? 'the untouched task passes the grade: the grade does not tell a solved task from an unsolved one'
            : undefined;
    const settled: ImageCheck = {
      ...check,
      state: reason ? 'invalid' : 'validated',
      endedAt: new Date(this.deps.now()).toISOString(),
      ...(untouched ? { untouched } : {}),
      ...(reference ? { reference } : {}),
      ...(reason ? { reason } : {}),
    };
    await this.deps.redis.hset(keys.imageChecks, field, JSON.stringify(settled));
    return settled;
  }
}

/** The caller acting on its check's batch: the batch scopes come with `image:build` for this one purpose. */
function asBatchSubmitter(principal: Principal): Principal {
  return { ...principal, scopes: new Set([...principal.scopes, 'batch:submit']) };
}

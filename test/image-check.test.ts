/**
 * Environments checked before training uses them (issue 42 point 3): a build leaves its
 * reference paths out of every layer it stores; a check runs the untouched task (which
 * must fail its grade) and the task with the reference solution (which must pass), each
 * graded in a fresh sandbox as batches grade; `validated` is what a batch with
 * `requireValidated` needs, and anything else is refused, coded.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ImageCheck } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

let cluster: TestCluster;
/** Builds and checks environments: `image:build` (and reads layers), nothing to train with. */
let builder: string;
/** The tenant's trainer: runs sandboxes and batches, cannot build or check. */
let trainer: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-check' }] });
  builder = await cluster.token('env-lab', ['image:build', 'layer:read']);
  trainer = await cluster.token('env-lab', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'batch:submit', 'layer:read']);
});
afterAll(async () => {
  await cluster?.stop();
});

const b64 = (text: string) => Buffer.from(text).toString('base64');
/** The task: make /task/answer hold 42. Its grader checks that; the reference answer sits in /ref while building. */
const TASK_STEPS = ['FROM busybox', 'RUN mkdir -p /task /ref && echo 42 > /ref/answer && printf \'test "$(cat /task/answer 2>/dev/null)" = 42\\n\' > /task/grade.sh'];
const GRADE = { cmd: 'sh /task/grade.sh', collect: ['/task'] };

async function build(name: string, request: Record<string, unknown>): Promise<void> {
  const started = await api(cluster, builder, 'POST', '/v1/images/builds', { name, steps: TASK_STEPS, ...request });
  expect(started.status, JSON.stringify(started.body)).toBe(202);
  const ended = await waitFor(`build ${name}`, async () => {
    const b = (await api(cluster, builder, 'GET', `/v1/images/builds/${started.body.id}`)).body;
    return ['ready', 'failed'].includes(b.state) ? b : undefined;
  }, 120_000);
  expect(ended.state, JSON.stringify(ended.error)).toBe('ready');
}

async function checked(name: string, request: Record<string, unknown>): Promise<ImageCheck> {
  const started = await api<ImageCheck>(cluster, builder, 'POST', `/v1/images/${name}/check`, request);
  expect(started.status, JSON.stringify(started.body)).toBe(202);
  expect(started.body).toMatchObject({ image: name, state: 'checking' });
  return waitFor(`check of ${name}`, async () => {
    const check = (await api<ImageCheck>(cluster, builder, 'GET', `/v1/images/${name}/check`)).body;
    return check.state !== 'checking' ? check : undefined;
  }, 120_000);
}

const submit = (image: string, requireValidated?: boolean) =>
  api(cluster, trainer, 'POST', '/v1/batches', { tasks: [{ customId: 't', image: { base: image }, steps: [{ cmd: 'true' }] }], ...(requireValidated === undefined ? {} : { requireValidated }) });

describe('image checks', () => {
  beforeAll(async () => {
    await build('task-env', { referencePaths: ['/ref'] });
    await build('task-env-loose', {});
  }, 300_000);

  it('leaves reference paths out of every layer the build stores', async () => {
    const created = await api(cluster, trainer, 'POST', '/v1/sandboxes', { image: { base: 'task-env' } });
    expect(created.status).toBe(201);
    const ls = await api(cluster, trainer, 'POST', `/v1/sandboxes/${created.body.id}/exec`, { cmd: 'ls /ref 2>&1; cat /task/grade.sh' });
    expect(ls.body.stdout).toMatch(/No such file or directory/);
    expect(ls.body.stdout).toContain('test "$(cat /task/answer 2>/dev/null)" = 42');
    await api(cluster, trainer, 'DELETE', `/v1/sandboxes/${created.body.id}`);
    // The same steps without reference paths: another cache key, the answer kept.
    const loose = await api(cluster, trainer, 'POST', '/v1/sandboxes', { image: { base: 'task-env-loose' } });
    expect((await api(cluster, trainer, 'POST', `/v1/sandboxes/${loose.body.id}/exec`, { cmd: 'cat /ref/answer' })).body.stdout).toBe('42\n');
    await api(cluster, trainer, 'DELETE', `/v1/sandboxes/${loose.body.id}`);
  });

  it('validates an image whose untouched task fails and whose reference solution passes; a batch requiring it runs', async () => {
    expect((await submit('task-env', true)).body.error.message).toMatch(/image task-env is not validated: it has no check/);
    const check = await checked('task-env', { reference: { files: { '/task/answer': b64('42\n') } }, grade: GRADE });
    expect(check, JSON.stringify(check)).toMatchObject({ state: 'validated', untouched: { grade: { passed: false, exitCode: 1 } }, reference: { status: 'succeeded', grade: { passed: true, exitCode: 0 } } });
    expect(check.reason).toBeUndefined();
    // The image shows it; the check's runs are a batch of the tenant's.
    expect((await api(cluster, builder, 'GET', '/v1/images/task-env')).body.check).toMatchObject({ state: 'validated', batchId: check.batchId });
    expect((await api(cluster, trainer, 'GET', `/v1/batches/${check.batchId}`)).body.counts).toMatchObject({ total: 2 });
    const accepted = await submit('task-env', true);
    expect(accepted.status, JSON.stringify(accepted.body)).toBe(201);
    expect(accepted.body.options.requireValidated).toBe(true);
  });

  it('finds invalid a grade the untouched task passes, and a reference solution that fails; batches requiring validation are refused', async () => {
    const lenient = await checked('task-env-loose', { reference: { files: { '/task/answer': b64('42\n') } }, grade: { cmd: 'true' } });
    expect(lenient).toMatchObject({ state: 'invalid', untouched: { grade: { passed: true } } });
    expect(lenient.reason).toMatch(/untouched task passes the grade/);
    const wrong = await checked('task-env-loose', { reference: { steps: [{ cmd: 'echo 41 > /task/answer' }] }, grade: GRADE });
    expect(wrong).toMatchObject({ state: 'invalid', reference: { grade: { passed: false } } });
    expect(wrong.reason).toMatch(/reference solution fails the grade/);
    const refused = await submit('task-env-loose', true);
    expect([refused.status, refused.body.error.code]).toEqual([409, 'invalid_state']);
    expect(refused.body.error.message).toMatch(/task-env-loose is not validated: its check found it invalid: the reference solution fails/);
    // Without requireValidated nothing is asked.
    expect((await submit('task-env-loose')).status).toBe(201);
  });

  it('refuses, coded: a check without image:build, of an image that does not exist, without a reference solution', async () => {
    const request = { reference: { files: { '/task/answer': b64('42\n') } }, grade: GRADE };
    expect((await api(cluster, trainer, 'POST', '/v1/images/task-env/check', request)).body.error.code).toBe('forbidden');
    expect((await api(cluster, builder, 'POST', '/v1/images/no-such-image/check', request)).body.error.code).toBe('not_found');
    expect((await api(cluster, builder, 'POST', '/v1/images/task-env/check', { reference: {}, grade: GRADE })).body.error.code).toBe('invalid_request');
    expect((await api(cluster, builder, 'GET', '/v1/images/busybox/check')).body.error.code).toBe('not_found');
  });
});

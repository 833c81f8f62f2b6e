import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Batch, BatchResultLine } from '../src/api/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { allBatchResults } from './support/batches.ts';
import { tarOf } from './support/tar.ts';

let cluster: TestCluster;
let token: string;

const allResults = (id: string, t = token) => allBatchResults(cluster, t, id);

const step = (cmd: string, timeoutMs = 20_000) => ({ cmd, timeoutMs });

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'batch-node', env: { ROLLBOX_NODE_MAX_STARTING: '16' } }], env: { ROLLBOX_BATCH_SLOTS: '12', ROLLBOX_HEARTBEAT_MS: '500', ROLLBOX_BODY_LIMIT_BYTES: String(256 * 1024) } });
  token = await cluster.token('eval-team', ['batch:submit', 'layer:write', 'sandbox:read']);
});
afterAll(async () => {
  await cluster?.stop();
});

describe('evaluation batches', () => {
  it('runs 500 tasks of mixed outcomes: one result line each, the right count in every class', async () => {
    // Latency class: besteffort tasks (the default) only get what the host leaves idle, and on a
    // CI host busy with other test files that made this a two-minute test of the host's load.
    const kinds = ['pass', 'fail', 'timeout'] as const;
    const tasks = Array.from({ length: 499 }, (_, i) => {
      const kind = kinds[i % 3]!;
      const cmd = kind === 'pass' ? `echo task-${i}` : kind === 'fail' ? 'echo broken >&2; exit 3' : 'sleep 5';
      return { customId: `${kind}-${i}`, resources: { memoryMiB: 32, cpuMillis: 100 }, steps: [step(cmd, kind === 'timeout' ? 300 : 20_000)] };
    });
    tasks.push({ customId: 'missing-image', image: { base: 'busybox', layers: ['no-such-layer'] }, steps: [step('true')] } as never);
    const submitted = await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks, maxConcurrency: 24, metadata: { suite: 'mixed' }, class: 'latency' });
    expect(submitted.status).toBe(201);
    expect(submitted.body.state).toBe('in_progress');
    expect(submitted.body.counts.total).toBe(500);
    const { lines, batch } = await allResults(submitted.body.id);
    expect(batch.state).toBe('completed');
    const unexpected = lines.filter((l) => !l.customId.startsWith({ succeeded: 'pass', failed: 'fail', timeout: 'timeout' }[l.status as string] ?? '?') && l.customId !== 'missing-image');
    expect(unexpected.map((l) => ({ customId: l.customId, status: l.status, error: l.error, steps: l.steps }))).toEqual([]);
    expect(batch.counts).toEqual({ total: 500, queued: 0, running: 0, succeeded: 167, failed: 167, timeout: 166, infra_error: 0, cancelled: 0 });
    expect(new Set(lines.map((l) => l.customId)).size).toBe(500);
    expect(lines).toHaveLength(500);
    const byId = new Map(lines.map((l) => [l.customId, l]));
    expect(byId.get('pass-0')).toMatchObject({ status: 'succeeded', attempts: 1, steps: [{ exitCode: 0, stdout: 'task-0\n' }] });
    expect(byId.get('fail-1')).toMatchObject({ status: 'failed', steps: [{ exitCode: 3, stderr: 'broken\n' }] });
    expect(byId.get('timeout-2')).toMatchObject({ status: 'timeout', steps: [{ exitCode: null, timedOut: true }] });
    expect(byId.get('missing-image')).toMatchObject({ status: 'failed', steps: [], error: { code: 'not_found' } });
    for (const s of ['validating', 'in_progress', 'finalizing', 'completed'] as const) expect(batch.timestamps[s]).toBeTruthy();
    expect(batch.options.metadata).toEqual({ suite: 'mixed' });
    const listed = await api<{ batches: Batch[] }>(cluster, token, 'GET', '/v1/batches');
    expect(listed.body.batches.map((b) => b.id)).toContain(batch.id);
    // Another tenant sees none of it.
    const other = await cluster.token('other-team', ['batch:submit']);
    expect((await api(cluster, other, 'GET', `/v1/batches/${batch.id}`)).status).toBe(404);
  }, 240_000);

  it('takes NDJSON streamed line by line, and refuses a bad line naming it', async () => {
    const ndjson = Array.from({ length: 30 }, (_, i) => JSON.stringify({ customId: `t${i}`, steps: [step(`echo ${i}; echo $SEED`)], env: { SEED: 's' } })).join('\n') + '\n';
    const ok = await api<Batch>(cluster, token, 'POST', '/v1/batches?maxConcurrency=4&metadata=%7B%22k%22%3A%22v%22%7D', ndjson, { 'content-type': 'application/x-ndjson' });
    expect(ok.status).toBe(201);
    expect(ok.body).toMatchObject({ state: 'in_progress', counts: { total: 30 }, options: { maxConcurrency: 4, metadata: { k: 'v' } } });
    // Follow it as server-sent events: results, then the end.
    const events = await fetch(`${cluster.url}/v1/batches/${ok.body.id}/events`, { headers: { authorization: `Bearer ${token}` } });
    const text = await events.text();
    const results = [...text.matchAll(/event: result\ndata: (.*)\nid: /g)].map((m) => JSON.parse(m[1]!) as BatchResultLine);
    expect(results).toHaveLength(30);
    expect(results.find((r) => r.customId === 't7')?.steps[0]?.stdout).toBe('7\ns\n');
    expect(text).toMatch(/event: end\ndata: .*"state":"completed"/);
    // Resuming after a cursor gives only what came after it.
    const after = results[9]!.cursor;
    const rest = await fetch(`${cluster.url}/v1/batches/${ok.body.id}/results?after=${after}`, { headers: { authorization: `Bearer ${token}` } });
    expect((await rest.text()).split('\n').filter(Boolean).map((l) => JSON.parse(l).customId)).toEqual(results.slice(10).map((r) => r.customId));

    // Streamed: the batch exists (validating) while its body still arrives, and NDJSON is not
    // held to the JSON cap (256 KiB here) that a JSON batch of the same tasks meets.
    const pad = 'x'.repeat(20_000);
    const bigTasks = Array.from({ length: 20 }, (_, i) => ({ customId: `big${i}`, env: { PAD: pad }, steps: [step('test ${#PAD} = 20000')] }));
    expect((await api(cluster, token, 'POST', '/v1/batches', { tasks: bigTasks })).status).toBe(413);
    let push!: (line: string | null) => void;
    const body = new ReadableStream<Uint8Array>({ start: (ctl) => void (push = (l) => (l === null ? ctl.close() : ctl.enqueue(new TextEncoder().encode(l)))) });
    const streamed = fetch(`${cluster.url}/v1/batches`, { method: 'POST', body, duplex: 'half', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/x-ndjson' } } as RequestInit);
    for (const t of bigTasks.slice(0, 10)) push(`${JSON.stringify(t)}\n`);
    await waitFor('the batch, validating while its body streams', async () => (await api<{ batches: Batch[] }>(cluster, token, 'GET', '/v1/batches')).body.batches.some((b) => b.state === 'validating'));
    for (const t of bigTasks.slice(10)) push(`${JSON.stringify(t)}\n`);
    push(null);
    const big = (await (await streamed).json()) as Batch;
    expect(big.counts.total).toBe(20);
    const bigDone = await allResults(big.id);
    expect(bigDone.lines.filter((l) => l.status !== 'succeeded').map((l) => ({ customId: l.customId, status: l.status, error: l.error, steps: l.steps }))).toEqual([]);

    const bad = `${JSON.stringify({ customId: 'a', steps: [step('true')] })}\n{"customId":"b","steps":[]}\n`;
    const refused = await api(cluster, token, 'POST', '/v1/batches', bad, { 'content-type': 'application/x-ndjson' });
    expect(refused.status).toBe(400);
    expect(refused.body.error.message).toMatch(/line 2: steps/);
    const failedId = /batch_[a-z0-9]+/.exec(refused.body.error.message)![0];
    expect((await api<Batch>(cluster, token, 'GET', `/v1/batches/${failedId}`)).body).toMatchObject({ state: 'failed', counts: { succeeded: 0 } });
    const dup = await api(cluster, token, 'POST', '/v1/batches', { tasks: [{ customId: 'x', steps: [step('true')] }, { customId: 'x', steps: [step('true')] }] });
    expect(dup.status).toBe(400);
  }, 120_000);

  it('grades in a fresh sandbox with what the task produced, the grader winning: cheating does not pay', async () => {
    // The task's repository and the grader's tests (a layer each).
    const repo = await tarOf([
      { name: 'work/', type: 'directory', mode: 0o755 },
      { name: 'work/repo/', type: 'directory', mode: 0o755 },
      { name: 'work/repo/tests/', type: 'directory', mode: 0o755 },
      { name: 'work/repo/tests/test.sh', content: 'echo the task copy of the test; exit 0\n', mode: 0o755 },
    ]);
    const grader = await tarOf([
      { name: 'work/', type: 'directory', mode: 0o755 },
      { name: 'work/repo/', type: 'directory', mode: 0o755 },
      { name: 'work/repo/tests/', type: 'directory', mode: 0o755 },
      { name: 'work/repo/tests/test.sh', content: '[ "$(cat /work/repo/answer 2>/dev/null)" = 42 ] && echo REAL PASS && exit 0; echo REAL FAIL; exit 1\n', mode: 0o755 },
    ]);
    for (const [name, tar] of [['task-repo', repo], ['task-grader', grader]] as const) {
      expect((await api(cluster, token, 'POST', `/v1/layers?name=${name}`, new Uint8Array(tar), { 'content-type': 'application/x-tar' })).status).toBe(201);
    }
    const grade = { mode: 'fresh-sandbox', cmd: 'sh /work/repo/tests/test.sh', layers: ['task-grader'], collect: ['/work/repo'] };
    const image = { base: 'busybox', layers: ['task-repo'] };
    const cheats = [
      'echo REAL PASS; echo "exit 0" > /work/repo/tests/test.sh', // fake output, edited test
      'rm -rf /work/repo/tests', // deleted tests
      'rm /bin/sh && printf "#!/.rollbox/busybox sh\\necho REAL PASS\\nexit 0\\n" > /bin/sh && chmod +x /bin/sh', // replaced shell
      'mkdir -p /etc/profile.d && echo "echo REAL PASS; exit 0" > /etc/profile.d/x.sh; echo 42 > /tmp/answer', // planted outside collect
      '(while true; do echo "echo REAL PASS; exit 0" > /work/repo/tests/test.sh; sleep 0.01; done) >/dev/null 2>&1 &', // a process left running, rewriting the test
    ];
    const tasks = [
      ...cheats.map((cmd, i) => ({ customId: `cheat-${i}`, image, steps: [step(cmd)], grade })),
      { customId: 'honest', image, steps: [step('echo 42 > /work/repo/answer')], grade },
    ];
    const submitted = await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks });
    const { lines } = await allResults(submitted.body.id);
    const byId = new Map(lines.map((l) => [l.customId, l]));
    expect(byId.get('honest')!.grade).toMatchObject({ mode: 'fresh-sandbox', passed: true, exitCode: 0, stdout: 'REAL PASS\n' });
    for (let i = 0; i < cheats.length; i++) {
      const l = byId.get(`cheat-${i}`)!;
      expect(l.status, `cheat ${i}: ${JSON.stringify(l)}`).toBe('succeeded');
      expect(l.grade, `cheat ${i}`).toMatchObject({ passed: false, exitCode: 1, stdout: 'REAL FAIL\n' });
    }
  }, 120_000);

  it('grades in the same sandbox: grader files hidden and intact during the steps, revealed at grading', async () => {
    const grader = await tarOf([
      { name: 'grader/', type: 'directory', mode: 0o755 },
      { name: 'grader/check.sh', content: 'ps -o args | grep -v grep | grep -c "sleep 1000" ; [ "$(cat /root/out)" = done ] && echo GRADED OK\n', mode: 0o755 },
    ]);
    expect((await api(cluster, token, 'POST', '/v1/layers?name=same-grader', new Uint8Array(grader), { 'content-type': 'application/x-tar' })).status).toBe(201);
    const task = {
      customId: 'same',
      image: { base: 'busybox', layers: ['same-grader'] },
      hiddenPaths: ['/grader'],
      steps: [
        step('cat /grader/check.sh; echo "---"; echo tampered > /grader/check.sh; ls -la /grader; echo done > /root/out'),
        step('sleep 1000 >/dev/null 2>&1 & echo started'),
      ],
      grade: { mode: 'same-sandbox', cmd: 'cat /grader/check.sh | head -c 2; echo; sh /grader/check.sh' },
    };
    const submitted = await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks: [task] });
    const { lines } = await allResults(submitted.body.id);
    const [line] = lines;
    expect(line!.steps[0]!.stdout).not.toContain('GRADED OK');
    expect(line!.grade).toMatchObject({ mode: 'same-sandbox', passed: true });
    // Intact (the original first line), the steps' background sleep killed (none left), the output as the grader made it.
    expect(line!.grade!.stdout).toBe('ps\n0\nGRADED OK\n');
  }, 60_000);

  it('cancel mid-batch keeps finished results; a tenant submitting later is not starved', async () => {
    const slow = Array.from({ length: 60 }, (_, i) => ({ customId: `s${i}`, resources: { memoryMiB: 32, cpuMillis: 100 }, steps: [step('sleep 0.4')] }));
    const big = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks: slow, maxConcurrency: 12 })).body;
    const otherToken = await cluster.token('small-team', ['batch:submit']);
    const small = (await api<Batch>(cluster, otherToken, 'POST', '/v1/batches', { tasks: slow.slice(0, 6), maxConcurrency: 12 })).body;
    // The later, smaller batch of another tenant gets its share at once and ends first.
    const smallDone = await allResults(small.id, otherToken);
    expect(smallDone.batch.state).toBe('completed');
    const bigNow = (await api<Batch>(cluster, token, 'GET', `/v1/batches/${big.id}`)).body;
    expect(bigNow.counts.succeeded).toBeLessThan(60);
    await waitFor('some results', async () => (await api<Batch>(cluster, token, 'GET', `/v1/batches/${big.id}`)).body.counts.succeeded >= 8, 60_000);
    const cancelled = await api<Batch>(cluster, token, 'POST', `/v1/batches/${big.id}/cancel`);
    expect(['cancelling', 'cancelled']).toContain(cancelled.body.state);
    const { lines, batch } = await allResults(big.id);
    expect(batch.state).toBe('cancelled');
    expect(lines).toHaveLength(60);
    expect(batch.counts.succeeded + batch.counts.cancelled).toBe(60);
    expect(batch.counts.succeeded).toBeGreaterThanOrEqual(8);
    expect(lines.filter((l) => l.status === 'succeeded')).toHaveLength(batch.counts.succeeded);
    // Nothing of the batch is left running.
    const reader = await cluster.token('eval-team', ['sandbox:read']);
    await waitFor('its sandboxes gone', async () => {
      const live = (await api<{ sandboxes: { state: string }[] }>(cluster, reader, 'GET', `/v1/sandboxes?label=rollbox.batch=${big.id}`)).body.sandboxes;
      return live.every((s) => ['terminated', 'failed'].includes(s.state));
    }, 60_000); // deletes of the cancelled tasks' sandboxes: seconds each on a loaded host
  }, 180_000);

  it('expires a batch at the end of its completion window: what ran stays, the rest ends cancelled', async () => {
    const tasks = Array.from({ length: 20 }, (_, i) => ({ customId: `e${i}`, resources: { memoryMiB: 32, cpuMillis: 100 }, steps: [step('sleep 0.3')] }));
    const submitted = (await api<Batch>(cluster, token, 'POST', '/v1/batches', { tasks, maxConcurrency: 1, completionWindowSeconds: 5, class: 'latency' })).body;
    const { lines, batch } = await allResults(submitted.id);
    expect(batch.state).toBe('expired');
    expect(batch.timestamps.expired).toBeTruthy();
    expect(lines).toHaveLength(20);
    expect(batch.counts.succeeded).toBeGreaterThan(0);
    expect(batch.counts.succeeded + batch.counts.cancelled).toBe(20);
    expect(lines.find((l) => l.status === 'cancelled')?.error?.message).toMatch(/completion window/);
  }, 60_000);
});

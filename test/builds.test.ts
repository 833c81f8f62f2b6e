import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { Sandbox, Template } from 'e2b';
import { runRollbox } from './support/cli.ts';
import { startTargetNetns, type TargetNetns } from './support/target-netns.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';
import { tarOf, type TarEntry } from './support/tar.ts';

let cluster: TestCluster;
/** Builds images (its own token: `image:build` only). */
let builder: string;
/** Runs what was built: a runtime agent's scopes, no `image:build`. */
let agent: string;

/** "The outside" for RUN steps: a namespace of the test's own with listeners that answer `hello <port>`. */
let target: TargetNetns;
const OPEN_PORT = 7301;
const ASKED_PORT = 7302;

beforeAll(async () => {
  target = await startTargetNetns({ subnet: 83, holdPort: 7309, ports: [OPEN_PORT, ASKED_PORT] });
  // Every build's RUN steps may reach OPEN_PORT there; ASKED_PORT only when a build asks.
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-build' }], env: { ROLLBOX_BUILD_NETWORK_ALLOW: `${target.address}:${OPEN_PORT}` } });
  builder = await cluster.token('lab', ['image:build', 'layer:read']);
  agent = await cluster.token('lab', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
});
afterAll(async () => {
  await cluster?.stop();
  await target?.stop();
});

const TAR = { 'content-type': 'application/x-tar' };

const DOCKERFILE = `ARG GREETING=hello
# stage 1 makes the "binary"
FROM busybox AS compile
ARG GREETING
WORKDIR /src
COPY tool.sh .
RUN mkdir -p /out && sed "s/GREETING/$GREETING/" tool.sh > /out/tool \\
  && chmod 755 /out/tool

FROM busybox
ENV APP_HOME=/srv/app MODE="test mode"
RUN echo 'app:x:1234:2345::/home/app:/bin/sh' >> /etc/passwd && echo 'app:x:2345:' >> /etc/group
WORKDIR $APP_HOME
COPY --from=compile /out/tool /usr/local/bin/tool
COPY --chown=app:app --chmod=640 config/ ./config/
COPY --chown=1234 data.txt .
USER app
CMD ["tool"]
`;

function contextEntries(data: string): TarEntry[] {
  return [
    { name: 'Dockerfile', content: DOCKERFILE },
    { name: '.dockerignore', content: '# not shipped\nconfig/secret.txt\n*.log\n' },
    { name: 'tool.sh', content: '#!/bin/sh\necho GREETING from tool\n', mode: 0o644 },
    { name: 'config/', type: 'directory', mode: 0o755 },
    { name: 'config/app.conf', content: 'port=8080\n', mode: 0o644 },
    { name: 'config/secret.txt', content: 'reference answer\n' },
    { name: 'data.txt', content: data },
    { name: 'debug.log', content: 'noise\n' },
  ];
}

async function uploadContext(entries: TarEntry[]): Promise<{ status: number; body: any }> {
  return api(cluster, builder, 'POST', '/v1/images/builds/contexts', await tarOf(entries), TAR);
}

async function build(request: Record<string, unknown>): Promise<any> {
  const started = await api(cluster, builder, 'POST', '/v1/images/builds', request);
  expect(started.status, JSON.stringify(started.body)).toBe(202);
  return waitEnded(started.body.id as string);
}

async function waitEnded(id: string): Promise<any> {
  return waitFor(`build ${id}`, async () => {
    const b = (await api(cluster, builder, 'GET', `/v1/images/builds/${id}`)).body;
    return ['ready', 'failed'].includes(b.state) ? b : undefined;
  }, 120_000);
}

async function run(image: string, cmd: string): Promise<{ stdout: string; stderr: string; exitCode: number }> {
  const created = await api(cluster, agent, 'POST', '/v1/sandboxes', { image: { base: image, layers: [] } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  try {
    return (await api(cluster, agent, 'POST', `/v1/sandboxes/${created.body.id}/exec`, { cmd })).body;
  } finally {
    await api(cluster, agent, 'DELETE', `/v1/sandboxes/${created.body.id}`);
  }
}

describe('image builds from a Dockerfile', () => {
  let first: any;
  let context: string;

  it('builds a multi-stage Dockerfile whose result runs with its files, owners, env, workdir and user', async () => {
    expect((await api(cluster, agent, 'POST', '/v1/images/builds', { name: 'x', steps: ['FROM busybox'] })).status).toBe(403);
    const uploaded = await uploadContext(contextEntries('v1\n'));
    expect(uploaded.status, JSON.stringify(uploaded.body)).toBe(201);
    context = uploaded.body.context;

    // The log streams while the build runs: step events, then the end with the record.
    const started = await api(cluster, builder, 'POST', '/v1/images/builds', { name: 'app', context, buildArgs: { GREETING: 'howdy' } });
    expect(started.status, JSON.stringify(started.body)).toBe(202);
    const events = await fetch(`${cluster.url}/v1/images/builds/${started.body.id}/events`, { headers: { authorization: `Bearer ${builder}` } });
    const text = await events.text();
    expect(text).toContain('event: step');
    expect(text).toMatch(/event: end\ndata: \{"seq":\d+,"kind":"end","state":"ready"/);
    first = await waitEnded(started.body.id);
    expect(first.state, JSON.stringify(first)).toBe('ready');
    expect(first.steps.every((s: { state: string }) => s.state === 'done' || s.state === 'cached')).toBe(true);
    expect(first.stepsRun).toBeGreaterThanOrEqual(7);

    const seen = await run('app', 'id -u; id -g; pwd; echo "$APP_HOME|$MODE"; tool; stat -c "%n %u:%g %a" config/app.conf data.txt /usr/local/bin/tool; ls config; ls /srv/app; cat data.txt');
    expect(seen.stderr).toBe('');
    expect(seen.stdout).toBe(
      ['1234', '2345', '/srv/app', '/srv/app|test mode', 'howdy from tool', 'config/app.conf 1234:2345 640', 'data.txt 1234:1234 644', '/usr/local/bin/tool 0:0 755', 'app.conf', 'config', 'data.txt', 'v1', ''].join('\n'),
    );
    const image = (await api(cluster, builder, 'GET', '/v1/images/app')).body;
    expect(image).toMatchObject({ name: 'app', state: 'ready', config: { WorkingDir: '/srv/app', User: 'app', Cmd: ['tool'] } });
    expect(image.config.Env).toEqual(expect.arrayContaining(['APP_HOME=/srv/app', 'MODE=test mode']));
  });

  it('rebuilds nothing when nothing changed, and only the last COPY when its input changed', async () => {
    const again = await build({ name: 'app', context, buildArgs: { GREETING: 'howdy' } });
    expect(again.state).toBe('ready');
    expect(again.stepsRun).toBe(0);
    expect(again.digest).toBe(first.digest);

    // The context is kept by digest for its tenant: a client sends the same bytes once; another tenant neither finds it nor builds from it.
    const kept = await api(cluster, builder, 'GET', `/v1/images/builds/contexts/${context}`);
    expect(kept.status, JSON.stringify(kept.body)).toBe(200);
    expect(kept.body).toMatchObject({ context, entries: contextEntries('v1\n').length });
    const stranger = await cluster.token('other-lab', ['image:build']);
    expect((await api(cluster, stranger, 'GET', `/v1/images/builds/contexts/${context}`)).body.error.code).toBe('not_found');
    expect((await api(cluster, stranger, 'POST', '/v1/images/builds', { name: 'app', context })).body.error.code).toBe('not_found');
    expect((await api(cluster, builder, 'GET', `/v1/images/builds/contexts/sha256:${'0'.repeat(64)}`)).body.error.code).toBe('not_found');

    const changed = await uploadContext(contextEntries('v2\n'));
    const rebuilt = await build({ name: 'app', context: changed.body.context, buildArgs: { GREETING: 'howdy' } });
    expect(rebuilt.state).toBe('ready');
    expect(rebuilt.stepsRun).toBe(1);
    const ran = rebuilt.steps.filter((s: { state: string; layer?: string }) => s.state === 'done' && s.layer);
    expect(ran.map((s: { text: string }) => s.text)).toEqual(['COPY --chown=1234 data.txt .']);
    expect((await run('app', 'cat data.txt; tool')).stdout).toBe('v2\nhowdy from tool\n');
  });

  it('builds each step once when two builds of one Dockerfile run at once', async () => {
    const steps = ['FROM busybox', `RUN echo ${Date.now()} > /stamp && sleep 1`, 'RUN cat /stamp > /stamp2', 'ENV DONE=1'];
    const [a, b] = await Promise.all([build({ name: 'twin-a', steps }), build({ name: 'twin-b', steps })]);
    expect([a.state, b.state]).toEqual(['ready', 'ready']);
    expect(a.stepsRun + b.stepsRun).toBe(2);
    expect(a.stepsCached + b.stepsCached).toBe(2);
    expect((await run('twin-b', 'cat /stamp2; echo $DONE')).stdout).toBe(`${steps[1]!.split(' ')[2]}\n1\n`);
  });
});

describe('image build refusals', () => {
  it('refuses a Dockerfile that does not parse, or asks for what the builder cannot do, naming the line', async () => {
    const bad = await api(cluster, builder, 'POST', '/v1/images/builds', { name: 'bad', dockerfile: 'FROM busybox\nRUN true\nFROBNICATE now\n' });
    expect(bad.status).toBe(400);
    expect(bad.body.error.code).toBe('invalid_dockerfile');
    expect(bad.body.error.message).toContain('line 3');
    const mount = await api(cluster, builder, 'POST', '/v1/images/builds', { name: 'bad', dockerfile: 'FROM busybox\n\nRUN --mount=type=cache,target=/root/.cache \\\n  true\n' });
    expect(mount.status).toBe(400);
    expect(mount.body.error).toMatchObject({ code: 'build_unsupported' });
    expect(mount.body.error.message).toMatch(/line 3: RUN --mount/);
    const health = await api(cluster, builder, 'POST', '/v1/images/builds', { name: 'bad', steps: ['FROM busybox', 'HEALTHCHECK CMD true'] });
    expect(health.body.error.code).toBe('build_unsupported');
    expect(health.body.error.message).toContain('line 2');
  });

  it('refuses a context with a traversal or a symlink out, whole', async () => {
    for (const entries of [
      [{ name: 'ok.txt', content: 'x' }, { name: '../escape.txt', content: 'x' }],
      [{ name: 'ok.txt', content: 'x' }, { name: 'passwd', type: 'symlink', linkname: '../../etc/passwd' }],
      [{ name: 'abs', type: 'symlink', linkname: '/etc/shadow' }],
    ] as TarEntry[][]) {
      const r = await uploadContext(entries);
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(r.body.error.code).toBe('invalid_archive');
    }
  });

  it('ends a build whose RUN fails `failed` with its output, storing nothing', async () => {
    const failed = await build({ name: 'broken', steps: ['FROM busybox', 'RUN echo made > /made', 'RUN echo about to fail; echo oops >&2; exit 3'] });
    expect(failed.state).toBe('failed');
    expect(failed.error.code).toBe('build_step_failed');
    expect(failed.failedStep).toMatchObject({ line: 3, exitCode: 3 });
    expect(failed.failedStep.output).toContain('about to fail');
    expect(failed.failedStep.output).toContain('oops');
    expect((await api(cluster, builder, 'GET', '/v1/images/broken')).status).toBe(404);
    // The failing step was not cached: a rebuild runs it again (and only it).
    const again = await build({ name: 'broken', steps: ['FROM busybox', 'RUN echo made > /made', 'RUN echo about to fail; echo oops >&2; exit 3'] });
    expect(again.state).toBe('failed');
    expect(again.steps[1].state).toBe('cached');
  });

  it('ends a build past its step time or its disk `failed`, coded, storing nothing', async () => {
    const slow = await build({ name: 'too-slow', steps: ['FROM busybox', 'RUN echo started; sleep 60'], stepTimeoutMs: 2000 });
    expect(slow.state).toBe('failed');
    expect(slow.error.code).toBe('build_step_failed');
    expect(slow.error.message).toMatch(/line 2: .*ran out of time/);
    expect(slow.failedStep).toMatchObject({ line: 2, exitCode: null });
    expect(slow.failedStep.output).toContain('started');
    // The builder sandbox's disk is the request's: a step that writes past it fails with the kernel's word for it.
    const full = await build({ name: 'too-big', steps: ['FROM busybox', 'RUN dd if=/dev/zero of=/big bs=1M count=256'], resources: { diskMiB: 64 } });
    expect(full.state).toBe('failed');
    expect(full.error.code).toBe('build_step_failed');
    expect(full.failedStep.output).toMatch(/No space left on device/);
    for (const name of ['too-slow', 'too-big']) expect((await api(cluster, builder, 'GET', `/v1/images/${name}`)).status).toBe(404);
  });
});

describe('rollbox image build', () => {
  it('packs the context (what .dockerignore excludes left out), shows the steps on a progress bar, and exits non-zero with the output of a failed RUN', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-build-cli-'));
    try {
      await fs.mkdir(path.join(dir, 'site'));
      await fs.writeFile(path.join(dir, 'site/index.html'), '<h1>hi</h1>\n');
      await fs.writeFile(path.join(dir, 'site/draft.tmp'), 'draft\n');
      await fs.symlink('index.html', path.join(dir, 'site/home.html'));
      await fs.writeFile(path.join(dir, '.dockerignore'), '**/*.tmp\n');
      await fs.writeFile(path.join(dir, 'build.Dockerfile'), 'FROM busybox\nARG WHO\nCOPY site /www\nRUN echo "built by $WHO" > /www/by.txt\nWORKDIR /www\n');
      const built = await runRollbox(['image', 'build', '-f', path.join(dir, 'build.Dockerfile'), dir, '--name', 'cli-site', '--build-arg', 'WHO=cli', '--progress'], { url: cluster.url, token: builder });
      expect(built.code, built.stderr).toBe(0);
      expect(built.stdout).toMatch(/state\s+ready/);
      expect(built.stdout).toMatch(/steps\s+5 \(3 run, 0 cached\)/);
      expect(built.stderr).toMatch(/cli-site\s+\[#+\]\s+100%/);
      expect((await run('cli-site', 'pwd; ls; cat by.txt; readlink home.html')).stdout).toBe('/www\nby.txt\nhome.html\nindex.html\nbuilt by cli\nindex.html\n');

      await fs.writeFile(path.join(dir, 'Dockerfile'), 'FROM busybox\nRUN echo compiling; echo "error: no compiler" >&2; exit 2\n');
      const failed = await runRollbox(['image', 'build', dir, '--name', 'cli-broken'], { url: cluster.url, token: builder });
      expect(failed.code).not.toBe(0);
      expect(failed.stdout).toMatch(/state\s+failed/);
      expect(failed.stderr).toContain('error: no compiler');
      expect(failed.stderr).toContain('build_step_failed');
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});

describe("E2B's Template.build through the same engine", () => {
  it('builds a template from its steps and files with the real SDK; a sandbox of it has them, and failures come back as BuildError', async () => {
    const issue = async (scopes: string) => (await promisify(execFile)(process.execPath, [path.resolve(import.meta.dirname, '../bin/rollbox.js'), 'e2b-key', 'issue', '--tenant', 'lab', '--scopes', scopes], { env: { ...process.env, REDIS_URL: cluster.redisUrl } })).stdout.trim();
    // A builder key and a runtime key: the builder's cannot create sandboxes, the runtime's cannot build.
    const builderKey = await issue('image:build');
    const runtimeKey = await issue('sandbox:create,sandbox:exec,sandbox:read,sandbox:delete');
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-e2b-template-'));
    const opts = { apiUrl: cluster.url, sandboxUrl: cluster.url };
    try {
      await fs.mkdir(path.join(dir, 'app'));
      await fs.writeFile(path.join(dir, 'app/main.sh'), 'echo "main says $GREETING"\n');
      const template = Template({ fileContextPath: dir })
        .fromImage('busybox')
        .setEnvs({ GREETING: 'hi $there' })
        .copy('app', '/srv/app/')
        .runCmd('echo "app:x:1500:1500::/srv/app:/bin/sh" >> /etc/passwd && echo built > /srv/app/built.txt')
        .setWorkdir('/srv/app')
        .runCmd('id -u > /tmp/uid.txt', { user: 'app' })
        // Ready only once the start command has run a while: a create answers after that.
        .setStartCmd('sleep 1; echo started > /tmp/started; exec sleep 600', 'test -f /tmp/started');
      const logs: string[] = [];
      await expect(Template.build(template, 'e2b-app', { ...opts, apiKey: runtimeKey })).rejects.toThrow();
      const built = await Template.build(template, 'e2b-app', { ...opts, apiKey: builderKey, onBuildLogs: (l) => void logs.push(l.message) });
      expect(built.templateId).toBe('e2b-app');
      expect(logs.join('\n')).toMatch(/build ready/);

      const sbx = await Sandbox.create('e2b-app', { ...opts, apiKey: runtimeKey });
      try {
        const r = await sbx.commands.run('pwd; sh main.sh; cat built.txt /tmp/uid.txt; stat -c %u /tmp/uid.txt; id -u; cat /tmp/started; ps -o args | grep -q "^sleep 60[0]" && echo serving');
        expect(r.stdout).toBe('/srv/app\nmain says hi $there\nbuilt\n1500\n1500\n0\nstarted\nserving\n');
      } finally {
        await sbx.kill();
      }

      const failing = Template({ fileContextPath: dir }).fromImage('busybox').runCmd('echo "no such package" >&2; exit 7');
      await expect(Template.build(failing, 'e2b-broken', { ...opts, apiKey: builderKey })).rejects.toThrow(/exited 7[\s\S]*no such package/);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});

describe('the network of RUN steps', () => {
  it('reaches what the config and the request allow, and nothing else', async () => {
    const nc = (port: number) => `echo | nc -w 3 ${target.address} ${port}`;
    const open = await build({ name: 'net-open', steps: ['FROM busybox', `RUN ${nc(OPEN_PORT)} > /open.txt && grep -q hello /open.txt`] });
    expect(open.state, JSON.stringify(open.error)).toBe('ready');
    expect((await run('net-open', 'cat /open.txt')).stdout).toBe(`hello ${OPEN_PORT}\n`);

    const before = target.connections(ASKED_PORT).length;
    const refused = await build({ name: 'net-refused', steps: ['FROM busybox', `RUN ${nc(ASKED_PORT)} | grep hello || { echo "cannot reach ${ASKED_PORT}"; exit 4; }`] });
    expect(refused.state).toBe('failed');
    expect(refused.failedStep).toMatchObject({ exitCode: 4 });
    expect(refused.failedStep.output).toContain(`cannot reach ${ASKED_PORT}`);
    expect(target.connections(ASKED_PORT).length).toBe(before);

    const asked = await build({ name: 'net-asked', steps: ['FROM busybox', `RUN ${nc(ASKED_PORT)} | grep hello || { echo "cannot reach ${ASKED_PORT}"; exit 4; }`], network: { allow: [{ cidr: `${target.address}/32`, ports: [ASKED_PORT] }] } });
    expect(asked.state, JSON.stringify(asked.failedStep)).toBe('ready');
    expect(target.connections(ASKED_PORT).length).toBeGreaterThan(before);
  });
});

import { spawn } from 'node:child_process';
import { mkdtemp, mkdir, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Template } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packContext } from '../../src/cli/image-build.ts';
import { busyboxBaseTar } from '../../src/layers/index.ts';
import { api, startTestCluster, waitFor, type TestCluster } from '../support/cluster.ts';
import { PIP_DEMO, startPipIndex } from '../support/pip-index.ts';
import { DOCKER, dockerImport, ensureDockerd, progress, run, type Dockerd } from './host.ts';

/**
 * Issue 42's check that a build here means what `docker build` means: the same Dockerfiles
 * built by rollbox and by Debian's Docker (its own engine, started and stopped here when
 * none runs), on the same base (rollbox's busybox layer, or the root of a sandbox of E2B's
 * Debian `base`, imported into Docker). Docker's
 * result is saved (`docker save`) and imported into rollbox; both run as rollbox sandboxes,
 * so whatever the runtime adds is the same on both sides, and what is compared is what the
 * builds made: every file's name, type, owner, mode, size, content and link target; the
 * image's user, working directory and env as a command in it sees them; the image config.
 */
const DOCKER_BASE = 'rollbox-compare-busybox:1';

/** The runtime's own mounts and files: the same in every sandbox, left out. */
const PRUNED = '\\( -path /proc -o -path /sys -o -path /dev -o -path /.rollbox -o -path /etc/hosts -o -path /etc/hostname -o -path /etc/resolv.conf \\) -prune';
/** Run by each sandbox, as root: the whole tree but those. */
const TREE_PROBE = `find / -xdev ${PRUNED} -o -print | sort | while IFS= read -r f; do
  if [ -L "$f" ]; then echo "$f|$(stat -c '%u:%g|%a' "$f")|link|$(readlink "$f")";
  elif [ -d "$f" ]; then echo "$f|$(stat -c '%u:%g|%a' "$f")|dir";
  else echo "$f|$(stat -c '%u:%g|%a|%s' "$f")|$(md5sum < "$f" | cut -c1-32)"; fi
done`;
/** The same for an image with GNU find and xargs (thousands of files: one md5sum for many). */
const GNU_TREE_PROBE = `find / -xdev ${PRUNED} -o \\( -type d -printf '%p|%U:%G|%m|dir\\n' \\) -o \\( -type l -printf '%p|%U:%G|link|%l\\n' \\) -o -printf '%p|%U:%G|%m|%s\\n' | LC_ALL=C sort
find / -xdev ${PRUNED} -o -type f -print0 | xargs -0 md5sum | LC_ALL=C sort -k2`;
/** Run as the image's own user, in its own working directory. */
const SELF_PROBE = 'id -u; id -g; pwd; env | grep -v -E "^(HOSTNAME|SHLVL|PWD|_)=" | sort';

interface Case {
  name: string;
  files: Record<string, string>;
  /** Symlinks in the context: name -> target. */
  links?: Record<string, string>;
  dockerfile: string;
}

const CASES: Case[] = [
  {
    name: 'multi-stage',
    files: { 'tool.sh': '#!/bin/sh\necho GREETING from tool\n' },
    dockerfile: `ARG BASE
FROM $BASE AS compile
ARG GREETING=hello
WORKDIR /src
COPY tool.sh .
RUN mkdir -p /out/share && sed "s/GREETING/$GREETING/" tool.sh > /out/tool && chmod 755 /out/tool && echo data > /out/share/d.txt

FROM $BASE
ENV APP_HOME=/srv/app MODE="test mode"
WORKDIR $APP_HOME
COPY --from=compile /out/tool /usr/local/bin/tool
COPY --from=compile /out/share /opt/share
RUN echo x > /tmp/gone && mkdir -p /tmp/dir && touch /tmp/dir/f
RUN rm -rf /tmp/gone /tmp/dir && ln -s /opt/share/d.txt /srv/app/d-link
ENTRYPOINT ["/bin/sh", "-c"]
CMD ["tool"]
`,
  },
  {
    name: 'owners',
    files: {
      '.dockerignore': '# not shipped\nconfig/secret.txt\n*.log\n',
      'config/app.conf': 'port=8080\n',
      'config/secret.txt': 'reference answer\n',
      'data.txt': 'v1\n',
      'debug.log': 'noise\n',
      'README.md': '# readme\n',
      'NOTES.md': 'notes\n',
      'extra.txt': 'extra\n',
    },
    dockerfile: `ARG BASE
FROM $BASE
RUN echo 'app:x:1234:2345::/home/app:/bin/sh' >> /etc/passwd && echo 'app:x:2345:' >> /etc/group && mkdir -p /home/app && chown app:app /home/app
WORKDIR /srv/app
COPY --chown=app:app --chmod=640 config/ ./config/
COPY --chown=1234 data.txt .
COPY data.txt notes/renamed.txt
COPY *.md docs/
ADD extra.txt /opt/
USER app
WORKDIR sub
ENV HOME=/home/app
CMD ["sh"]
`,
  },
  {
    name: 'paths',
    files: { 'tool.sh': 'echo tool\n', 'sub/x/y.txt': 'y\n', 'sub/z.txt': 'z\n', 'target.txt': 'pointed at\n' },
    links: { 'link.txt': 'target.txt', 'sub/x/rel-link': '../z.txt' },
    dockerfile: `ARG BASE
FROM $BASE
ARG VERSION=1.2
ENV VERSION=$VERSION DIR=/opt/tool-\${VERSION} EMPTY=
COPY --chown=1234:5678 tool.sh $DIR/bin/
COPY sub/ /data/
COPY link.txt /data/link-copy
COPY sub /data2
USER 1234
WORKDIR /work/a/b
USER root
WORKDIR rel
RUN touch made-here && echo "$VERSION $DIR" > env.txt
`,
  },
];

let cluster: TestCluster;
let dockerd: Dockerd | undefined;
let workDir: string;
let builder: string;
let agent: string;
const dockerImages = new Set<string>([DOCKER_BASE]);

beforeAll(async () => {
  workDir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-builds-vs-docker-'));
  // E2B's Debian `base` is built as the gateway starts (from the host's cache of it, as the E2B tests keep it).
  cluster = await startTestCluster({
    workers: [{ nodeId: 'node-vs-docker' }],
    env: { ROLLBOX_E2B_BASE_TEMPLATE: 'start', ROLLBOX_E2B_BASE_CACHE_DIR: '/var/tmp/rollbox-test-e2b-base', ROLLBOX_FILES_MAX_BYTES: String(512 * 1024 * 1024), ROLLBOX_EXEC_OUTPUT_CAP_BYTES: String(16 * 1024 * 1024) },
  });
  builder = await cluster.token('lab', ['image:build', 'layer:read', 'layer:write']);
  agent = await cluster.token('lab', ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete']);
  dockerd = await ensureDockerd(path.join(workDir, 'dockerd.log'), { v4: await run('iptables-save', []), v6: await run('ip6tables-save', []) });
  // The same base for both: rollbox's busybox layer, as a tar, imported into Docker.
  expect(await dockerImport(DOCKER_BASE, (await busyboxBaseTar()).tar)).toBe(0);
  progress('busybox base imported into Docker');
}, 10 * 60_000);

afterAll(async () => {
  await run(DOCKER, ['rmi', '-f', ...dockerImages]).catch(() => undefined);
  await dockerd?.stop();
  await cluster?.stop();
  if (workDir) await rm(workDir, { recursive: true, force: true });
});

async function writeContext(c: Case): Promise<string> {
  const dir = path.join(workDir, c.name);
  for (const [name, content] of Object.entries({ ...c.files, Dockerfile: c.dockerfile })) {
    await mkdir(path.dirname(path.join(dir, name)), { recursive: true });
    await writeFile(path.join(dir, name), content, { mode: 0o644 });
  }
  for (const [name, target] of Object.entries(c.links ?? {})) await symlink(target, path.join(dir, name));
  return dir;
}

async function buildInRollbox(c: Case, dir: string, extra: Record<string, unknown> = {}): Promise<void> {
  const uploaded = await api(cluster, builder, 'POST', '/v1/images/builds/contexts', await packContext(dir, ['Dockerfile', '.dockerignore']), { 'content-type': 'application/x-tar' });
  expect(uploaded.status, JSON.stringify(uploaded.body)).toBe(201);
  const started = await api(cluster, builder, 'POST', '/v1/images/builds', { name: `${c.name}-rollbox`, context: uploaded.body.context, buildArgs: { BASE: 'busybox' }, ...extra });
  expect(started.status, JSON.stringify(started.body)).toBe(202);
  const ended = await waitFor(`build ${c.name}`, async () => {
    const b = (await api(cluster, builder, 'GET', `/v1/images/builds/${started.body.id}`)).body;
    return ['ready', 'failed'].includes(b.state) ? b : undefined;
  }, 180_000);
  expect(ended.state, JSON.stringify(ended)).toBe('ready');
}

/** `docker build`, then `docker save` streamed into rollbox's image import. */
async function buildInDocker(c: Case, dir: string, flags: string[] = ['--network', 'none', '--build-arg', `BASE=${DOCKER_BASE}`]): Promise<void> {
  const tag = `rollbox-compare-${c.name}:1`;
  dockerImages.add(tag);
  // BuildKit, Docker's builder since 23.0 (and the only one that takes COPY --chmod).
  await run(DOCKER, ['build', '-q', ...flags, '-t', tag, dir], { env: { ...process.env, DOCKER_BUILDKIT: '1' } });
  const saving = spawn(DOCKER, ['save', tag], { stdio: ['ignore', 'pipe', 'inherit'] });
  const response = await fetch(`${cluster.url}/v1/images?name=${c.name}-docker&ref=${encodeURIComponent(tag)}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${builder}`, 'content-type': 'application/x-tar' },
    body: saving.stdout as unknown as BodyInit,
    duplex: 'half',
  } as RequestInit);
  expect(response.status, await response.clone().text()).toBe(201);
}

async function probe(image: string, treeProbe: string): Promise<{ tree: string; self: string }> {
  const created = await api(cluster, agent, 'POST', '/v1/sandboxes', { image: { base: image, layers: [] } });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  try {
    const exec = async (cmd: string, user?: string) => {
      const r = (await api(cluster, agent, 'POST', `/v1/sandboxes/${created.body.id}/exec`, { argv: ['/bin/sh', '-c', cmd], ...(user ? { user, cwd: '/' } : {}), timeoutMs: 300_000 })).body;
      expect(r.exitCode, JSON.stringify(r).slice(0, 2000)).toBe(0);
      expect(r.truncated).toBe(false);
      return r.stdout as string;
    };
    return { tree: await exec(treeProbe, '0'), self: await exec(SELF_PROBE) };
  } finally {
    await api(cluster, agent, 'DELETE', `/v1/sandboxes/${created.body.id}`);
  }
}

/** Within what E2B's SDK turns into template steps (one stage, USER and WORKDIR set, no ARG or CMD): its `fromDockerfile`. */
const E2B_CASE: Case = {
  name: 'e2b',
  files: { 'config/app.conf': 'port=8080\n', 'data.txt': 'v1\n' },
  dockerfile: `FROM busybox
RUN echo 'app:x:1234:2345::/home/app:/bin/sh' >> /etc/passwd && echo 'app:x:2345:' >> /etc/group && mkdir -p /home/app && chown app:app /home/app
ENV MODE=e2b
WORKDIR /srv/app
COPY --chown=app:app config/ /srv/app/config/
COPY data.txt /srv/app/notes/
RUN echo built > /srv/app/built.txt
USER app
WORKDIR /srv/app/sub
`,
};

async function compare(ours: string, docker: string, treeProbe = TREE_PROBE): Promise<void> {
  const [mine, theirs] = await Promise.all([probe(ours, treeProbe), probe(docker, treeProbe)]);
  progress(`${ours}: ${mine.tree.split('\n').length} entries compared`);
  expect(mine.self).toBe(theirs.self);
  expect(mine.tree).toBe(theirs.tree);
  const config = async (name: string) => (await api(cluster, builder, 'GET', `/v1/images/${name}`)).body.config;
  const [ourConfig, dockerConfig] = await Promise.all([config(ours), config(docker)]);
  for (const field of ['User', 'WorkingDir', 'Entrypoint', 'Cmd']) expect(ourConfig[field], field).toEqual(dockerConfig[field]);
  expect([...ourConfig.Env].sort()).toEqual([...dockerConfig.Env].sort());
}

describe('rollbox builds against docker build', () => {
  for (const c of CASES) {
    it(`${c.name}: the same files, owners, modes, env, user and workdir as docker build's image`, async () => {
      const dir = await writeContext(c);
      await Promise.all([buildInRollbox(c, dir), buildInDocker(c, dir)]);
      await compare(`${c.name}-rollbox`, `${c.name}-docker`);
    }, 8 * 60_000);
  }

  it("a Debian Dockerfile on E2B's base whose RUN pip-installs from an index the test serves: the same as docker build on the same base", async () => {
    // Docker's base: the root of a sandbox of rollbox's `base`, with its config.
    const base = await waitFor('the base template', async () => {
      const r = await api(cluster, builder, 'GET', '/v1/images/base');
      return r.status === 200 && r.body.state === 'ready' ? r.body : undefined;
    }, 10 * 60_000);
    const dockerBase = 'rollbox-compare-debian-base:1';
    dockerImages.add(dockerBase);
    const exporter = await api(cluster, agent, 'POST', '/v1/sandboxes', { image: { base: 'base', layers: [] }, resources: { diskMiB: 2048 } });
    expect(exporter.status, JSON.stringify(exporter.body)).toBe(201);
    try {
      const skip = ['./proc/*', './sys/*', './dev/*', './tmp/*', './.rollbox', './etc/hosts', './etc/hostname', './etc/resolv.conf'].map((p) => `--exclude=${p}`).join(' ');
      // Exit 1 is GNU tar's "a directory changed as it was read": the archive being written under /tmp.
      const packed = (await api(cluster, agent, 'POST', `/v1/sandboxes/${exporter.body.id}/exec`, { cmd: `tar -C / --numeric-owner --warning=no-file-changed ${skip} -czf /tmp/root.tar.gz . || [ $? -eq 1 ]`, user: '0', cwd: '/', timeoutMs: 300_000 })).body;
      expect(packed.exitCode, JSON.stringify(packed)).toBe(0);
      const tar = await fetch(`${cluster.url}/v1/sandboxes/${exporter.body.id}/files?path=/tmp/root.tar.gz`, { headers: { authorization: `Bearer ${agent}` } });
      expect(tar.status).toBe(200);
      const changes = [...base.config.Env.map((e: string) => `ENV ${e.replace('=', ' ')}`), `USER ${base.config.User}`, `WORKDIR ${base.config.WorkingDir}`];
      expect(await dockerImport(dockerBase, Buffer.from(await tar.arrayBuffer()), changes)).toBe(0);
    } finally {
      await api(cluster, agent, 'DELETE', `/v1/sandboxes/${exporter.body.id}`);
    }

    const index = await startPipIndex({ subnet: 102, holdPort: 7411, port: 7412 });
    try {
      // Bytecode is left out: a .pyc holds its source's mtime, which is when pip wrote it (a second apart, two builds differ).
      const debian: Case = {
        name: 'debian',
        files: {},
        dockerfile: `ARG BASE
FROM $BASE
ARG INDEX
ARG TRUSTED
USER root
RUN PYTHONDONTWRITEBYTECODE=1 python3 -m pip install --no-compile --break-system-packages --no-cache-dir --index-url "$INDEX" --trusted-host "$TRUSTED" ${PIP_DEMO.requirement}
USER user
WORKDIR /home/user/work
RUN python3 -c "import ${PIP_DEMO.module}; print(${PIP_DEMO.module}.VALUE)" > value.txt
`,
      };
      const dir = await writeContext(debian);
      const args = { INDEX: index.url, TRUSTED: index.address };
      await Promise.all([
        buildInRollbox(debian, dir, { buildArgs: { BASE: 'base', ...args }, network: { allow: [{ cidr: `${index.address}/32`, ports: [index.port] }] } }),
        // The engine here has no bridge: its builds use the host's network, which reaches the index's namespace.
        buildInDocker(debian, dir, ['--network', 'host', '--build-arg', `BASE=${dockerBase}`, ...Object.entries(args).flatMap(([k, v]) => ['--build-arg', `${k}=${v}`])]),
      ]);
      await compare('debian-rollbox', 'debian-docker', GNU_TREE_PROBE);
    } finally {
      await index.stop();
    }
  }, 15 * 60_000);

  it("E2B's Template().fromDockerfile with the real SDK: the same as docker build's image", async () => {
    const key = (await run(process.execPath, [path.resolve(import.meta.dirname, '../../bin/rollbox.js'), 'e2b-key', 'issue', '--tenant', 'lab', '--scopes', 'image:build'], { env: { ...process.env, REDIS_URL: cluster.redisUrl } })).trim();
    const dir = await writeContext({ ...E2B_CASE, dockerfile: E2B_CASE.dockerfile.replace('FROM busybox', `FROM ${DOCKER_BASE}`) });
    const template = Template({ fileContextPath: dir }).fromDockerfile(E2B_CASE.dockerfile);
    await Promise.all([Template.build(template, 'e2b-rollbox', { apiUrl: cluster.url, apiKey: key }), buildInDocker(E2B_CASE, dir)]);
    await compare('e2b-rollbox', 'e2b-docker');
  }, 8 * 60_000);
});

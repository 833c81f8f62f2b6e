/**
 * bench:build — the same Dockerfile built by rollbox (`POST /v1/images/builds`: its steps in
 * builder sandboxes, a layer per step, cached by step and inputs) and by `docker build`
 * (Debian's docker.io, its default builder; a Docker engine started here when none runs, and
 * stopped after), interleaved in the same run on the same base: rollbox's busybox base as a
 * tar, imported into Docker. Per round, each builder does:
 * - a cold build: a new NONCE build arg, stamped by the first step of each stage, so no step
 *   after it is found cached (target: rollbox <= 1.2x docker's time);
 * - a rebuild with nothing changed (target: rollbox <= 1 s);
 * - a rebuild after a change in the last step's input (the last COPY's file).
 * Times are a client's, end to end: the context packed and sent (rollbox: as `rollbox image
 * build` does; docker: its CLI's context transfer), the build, its end seen. RUN steps have no network in either.
 * Prints progress on stderr, ends with one JSON line.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { packContext } from '../src/cli/image-build.ts';
import { RollboxClient, BuildsClient } from '../src/client/index.ts';
import { busyboxBaseTar } from '../src/layers/index.ts';
import { progressBar, summarize } from '../src/report/index.ts';
import { startTestCluster } from '../test/support/cluster.ts';
import { DOCKER, dockerImport, ensureDockerd } from '../test/docker/host.ts';
import { timed } from './support/runc-floor.ts';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const LIB_FILES = Number(process.env.BENCH_LIB_FILES ?? 200);
const LIB_FILE_BYTES = 64 * 1024;
const DOCKER_BASE = 'rollbox-bench-busybox:1';
const run = promisify(execFile);

/** Two stages; each stamps NONCE first, so a new NONCE rebuilds every step after it. */
const DOCKERFILE = `ARG BASE=busybox
FROM $BASE AS build
ARG NONCE
RUN echo "$NONCE" > /nonce
RUN mkdir -p /out && i=0 && while [ $i -lt 2000 ]; do echo "module $i" > /out/m$i.txt; i=$((i+1)); done
COPY lib/ /src/lib/
RUN tar -cf - -C /src lib | gzip -1 > /out/lib.tar.gz && sha256sum /out/lib.tar.gz > /out/lib.sum

FROM $BASE
ARG NONCE
RUN echo "$NONCE" > /nonce
ENV APP_HOME=/srv/app MODE=bench
RUN echo 'app:x:1234:1234::/srv/app:/bin/sh' >> /etc/passwd && echo 'app:x:1234:' >> /etc/group
WORKDIR /srv/app
COPY --from=build /out/ /opt/app/
COPY --chown=app:app app/ ./
USER app
CMD ["sh"]
`;

const workDir = await fs.mkdtemp('/tmp/rollbox-bench-build-');
const context = path.join(workDir, 'context');
await fs.mkdir(path.join(context, 'lib'), { recursive: true });
await fs.mkdir(path.join(context, 'app'), { recursive: true });
await fs.writeFile(path.join(context, 'Dockerfile'), DOCKERFILE);
await fs.writeFile(path.join(context, '.dockerignore'), '*.log\n');
for (let i = 0; i < LIB_FILES; i++) await fs.writeFile(path.join(context, 'lib', `part${i}.txt`), randomBytes(LIB_FILE_BYTES / 2).toString('hex'));
const appFile = path.join(context, 'app', 'main.txt');

const cluster = await startTestCluster({ workers: [{ nodeId: 'bench-build' }], env: { ROLLBOX_HEARTBEAT_MS: '1000', ROLLBOX_NODE_LOST_AFTER_MS: '5000' } });
const dockerd = await ensureDockerd(path.join(workDir, 'dockerd.log'), { v4: (await run('iptables-save')).stdout, v6: (await run('ip6tables-save')).stdout });
process.once('SIGINT', () => void Promise.all([cluster.stop(), dockerd.stop()]).finally(() => process.exit(130)));
const dockerImages = new Set<string>([DOCKER_BASE]);
/** The JSON line, printed last (after the engine's own stop messages). */
let result: Record<string, unknown>;
try {
  // The same base for both: rollbox's busybox layer, as a tar, imported into Docker.
  if ((await dockerImport(DOCKER_BASE, (await busyboxBaseTar()).tar)) !== 0) throw new Error('docker import of the busybox base failed');

  const builds = new BuildsClient(new RollboxClient({ baseUrl: cluster.url, token: await cluster.token('bench', ['image:build', 'layer:read']) }));
  const viaRollbox = async (nonce: string, expectRun: (stepsRun: number) => boolean) => {
    // Packed as `rollbox image build` packs it (.dockerignore applied, as docker's CLI does).
    const uploaded = await builds.uploadContext(await packContext(context, ['Dockerfile', '.dockerignore']));
    const started = await builds.startBuild({ name: 'bench-app', context: uploaded.context, buildArgs: { NONCE: nonce } });
    const ended = await builds.waitForBuild(started.id);
    if (ended.state !== 'ready' || !expectRun(ended.stepsRun)) throw new Error(`rollbox build ${ended.id}: ${ended.state}, ${ended.stepsRun} steps run: ${JSON.stringify(ended).slice(0, 500)}`);
  };
  let dockerTag = 0;
  const viaDocker = async (nonce: string) => {
    const tag = `rollbox-bench-app:${++dockerTag}`;
    dockerImages.add(tag);
    await run(DOCKER, ['build', '-q', '--network', 'none', '--build-arg', `BASE=${DOCKER_BASE}`, '--build-arg', `NONCE=${nonce}`, '-t', tag, context], { maxBuffer: 16 << 20 });
  };

  const samples = { rollbox: { cold: [] as number[], unchanged: [] as number[], lastStep: [] as number[] }, docker: { cold: [] as number[], unchanged: [] as number[], lastStep: [] as number[] } };
  const bar = progressBar('builds (cold, unchanged, last step changed; rollbox and docker)', { total: ROUNDS * 6 });
  for (let round = 0; round < ROUNDS; round++) {
    const nonce = randomBytes(8).toString('hex');
    await fs.writeFile(appFile, `round ${round}\n`);
    // Which builder goes first alternates, so neither always meets the host's caches warm.
    const order = round % 2 === 0 ? (['rollbox', 'docker'] as const) : (['docker', 'rollbox'] as const);
    for (const kind of ['cold', 'unchanged', 'lastStep'] as const) {
      if (kind === 'lastStep') await fs.writeFile(appFile, `round ${round}, changed\n`);
      for (const builder of order) {
        const expectRun = kind === 'cold' ? (n: number) => n >= 8 : kind === 'unchanged' ? (n: number) => n === 0 : (n: number) => n === 1;
        samples[builder][kind].push(await timed(() => (builder === 'rollbox' ? viaRollbox(nonce, expectRun) : viaDocker(nonce))));
        bar.tick();
      }
    }
  }
  bar.done();

  const p50 = (xs: number[]) => summarize(xs).p50Ms;
  const ratio = (a: number, b: number) => Math.round((a / b) * 100) / 100;
  const figures = Object.fromEntries(
    (['cold', 'unchanged', 'lastStep'] as const).map((kind) => [kind, { rollboxP50Ms: p50(samples.rollbox[kind]), dockerP50Ms: p50(samples.docker[kind]), ratioP50: ratio(p50(samples.rollbox[kind]), p50(samples.docker[kind])) }]),
  );
  result = {
    bench: 'build',
    ...figures,
    rounds: ROUNDS,
    contextMB: Math.round(((LIB_FILES * LIB_FILE_BYTES) / 1e6) * 10) / 10,
    docker: (await run(DOCKER, ['version', '--format', '{{.Server.Version}}'])).stdout.trim(),
    targets: { cold: { ratioP50: 1.2 }, unchanged: { rollboxP50Ms: 1000 } },
  };
} finally {
  await run(DOCKER, ['rmi', '-f', ...dockerImages]).catch(() => undefined);
  await run(DOCKER, ['builder', 'prune', '-f']).catch(() => undefined);
  await dockerd.stop();
  await cluster.stop();
  await fs.rm(workDir, { recursive: true, force: true });
}
console.log(JSON.stringify(result));

import { createHash } from 'node:crypto';
import path from 'node:path';
import { CreateSandboxRequest, FILES_TAR_TYPE, MAX_STACK_LAYERS, RollboxError, type BuildRequest, type BuildStepState, type Image, type ImageConfig, type LayerDigest, type NetworkAllowRule } from '../api/index.ts';
import type { Principal } from '../iam/index.ts';
import type { ExecService, FilesService, SandboxService } from '../gateway/index.ts';
import type { StepCache } from './cache.ts';
import { dockerignore, headerOf, selectSources, type BuildContextFiles } from './context.ts';
import { expand, jsonArray, splitPairs, splitWords, type Instruction } from './dockerfile.ts';
import { argOf, type BuildPlan } from './plan.ts';
import { baseOf, fromOf, type FromDeps, type StageState } from './from.ts';
import { packTar, untar, type TarHeader } from './tar.ts';


export interface BuildEngineDeps extends FromDeps {
  sandboxes: Pick<SandboxService, 'create' | 'delete' | 'snapshot'>;
  files: Pick<FilesService, 'write' | 'read'>;
  execs: Pick<ExecService, 'exec'>;
  cache: StepCache;
  /** Destinations every build's RUN steps may reach (ROLLBOX_BUILD_NETWORK_ALLOW). */
  networkAllow: readonly NetworkAllowRule[];
  /** The lock of a step being run, renewed while it runs. */
  stepLeaseMs: number;
}

export interface BuildRun {
  id: string;
  tenant: string;
  request: BuildRequest;
  plan: BuildPlan;
  context: BuildContextFiles;
  /** A step began, or ended (with its layer); `output`: a RUN's output. */
  report: (index: number, state: BuildStepState, detail?: { layer?: LayerDigest; durationMs?: number; output?: string }) => Promise<void>;
  signal: AbortSignal;
}

/** A RUN that exited non-zero or ran out of time: the build ends `failed` with its output. */
export class StepFailed extends Error {
  constructor(
    readonly line: number,
    readonly text: string,
    readonly exitCode: number | null,
    readonly output: string,
  ) {
    super(`Dockerfile line ${line}: ${text} ${exitCode === null ? 'ran out of time' : `exited ${exitCode}`}`);
  }
}

/** Mount points the runtime makes, and the files it writes: never part of a step's layer. */
const SNAPSHOT_EXCLUDE = ['/proc', '/sys', '/dev', '/.rollbox', '/etc/resolv.conf', '/etc/hosts', '/etc/hostname'];
/** Everything a builder sandbox is used for, granted by the requester's `image:build`; it never holds more. */
const BUILDER_SCOPES = new Set(['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete', 'sandbox:snapshot'] as const);
const OUTPUT_MAX_CHARS = 16 * 1024;
const SANDBOX_TTL_MARGIN_SEC = 300;

const sha256 = (value: unknown) => createHash('sha256').update(typeof value === 'string' ? value : JSON.stringify(value)).digest('hex');

/**
 * Runs a planned build: each stage from its FROM, each step either found in the step cache
 * (keyed by the layers under it, the step as expanded, what it sees of the config, and the
 * digest of its inputs) or run in a builder sandbox of the tenant whose writes become the
 * step's layer. Answers the image (not yet stored: the caller stores it once, at the end).
 */
export async function runBuild(deps: BuildEngineDeps, run: BuildRun): Promise<{ layers: Image['layers']; config: ImageConfig; stepsRun: number; stepsCached: number }> {
  const acting: Principal = { tenant: run.tenant, scopes: BUILDER_SCOPES };
  const { request, plan } = run;
  const ignored = dockerignore(run.context.get('.dockerignore')?.data?.toString('utf8'));
  const done = new Map<string, StageState>();
  const allow = [...deps.networkAllow, ...request.network.allow];
  let index = 0;
  let stepsRun = 0;
  let stepsCached = 0;
  let last: StageState | undefined;

  for (const stage of plan.stages) {
    const started = Date.now();
    await run.report(index, 'running');
    const state = await fromOf(deps, run.tenant, stage, plan, done);
    await run.report(index++, 'done', { durationMs: Date.now() - started });
    for (const i of stage.instructions) {
      if (run.signal.aborted) throw run.signal.reason;
      const stepStarted = Date.now();
      await run.report(index, 'running');
      const vars = new Map([...state.args, ...state.env]);
      const made = await step(i, state, vars);
      if (made === 'config') await run.report(index, 'done', { durationMs: Date.now() - stepStarted });
      else {
        if (state.layers.length >= MAX_STACK_LAYERS) throw new RollboxError('invalid_request', `Dockerfile line ${i.line}: stage ${stage.name} would have more than ${MAX_STACK_LAYERS} layers (a sandbox stacks at most that many); join RUN steps`);
        state.layers.push(made.digest);
        if (made.cached) stepsCached++;
        else stepsRun++;
        await run.report(index, made.cached ? 'cached' : 'done', { layer: made.digest, durationMs: Date.now() - stepStarted });
      }
      index++;
    }
    done.set(stage.name, state);
    last = state;
  }

  /** One instruction: a change of the config, or a layer (cached or made). */
  async function step(i: Instruction, state: StageState, vars: Map<string, string>): Promise<'config' | { digest: LayerDigest; cached: boolean }> {
    const words = () => splitWords(expand(i.rest, vars, i.line), i.line);
    switch (i.keyword) {
      case 'ARG': {
        const [name, value] = argOf(i, vars);
        const given = request.buildArgs[name] ?? value ?? plan.globalArgs.get(name);
        state.args.set(name, given ?? '');
        return 'config';
      }
      case 'ENV':
        for (const [k, v] of splitPairs(expand(i.rest, vars, i.line), i.line, 'ENV')) state.env.set(k, v);
        return 'config';
      case 'LABEL':
      case 'MAINTAINER':
      case 'EXPOSE':
        words(); // checked (quotes, substitutions); the image record keeps no labels or ports
        return 'config';
      case 'USER': {
        const [user] = words();
        if (!user || !/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?$/.test(user)) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${i.line}: USER ${JSON.stringify(user ?? '')} is not name, uid, name:group or uid:gid`);
        state.user = user;
        return 'config';
      }
      case 'WORKDIR': {
        const [dir] = words();
        state.workdir = path.posix.resolve(state.workdir, dir ?? '/');
        if (state.workdir === '/') return 'config';
        // Docker makes the directory: a step of its own, cached like any other. Under a USER,
        // what it makes is that user's (BuildKit's WORKDIR; the user as the stage's /etc/passwd says).
        return layerStep(i, state, `WORKDIR ${state.workdir}`, '', async (sandboxId) => {
          await makeDirs(i, sandboxId, state.workdir, state.user ? await ownerIds(sandboxId, state.user, 'user') : undefined);
        });
      }
      case 'SHELL': {
        const shell = jsonArray(i.rest);
        if (!shell?.length) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${i.line}: SHELL takes a JSON array`);
        state.shell = shell;
        return 'config';
      }
      case 'CMD':
      case 'ENTRYPOINT': {
        const argv = jsonArray(i.rest) ?? [...state.shell, i.rest];
        if (i.keyword === 'CMD') state.cmd = argv;
        else {
          state.entrypoint = argv;
          state.cmd = undefined; // as Docker: a new ENTRYPOINT drops the CMD inherited from the base
        }
        return 'config';
      }
      case 'RUN': {
        const argv = jsonArray(i.rest) ?? [...state.shell, i.rest];
        const env = runEnv(state);
        return layerStep(i, state, i.text, sha256({ argv, env, allow }), async (sandboxId) => {
          const result = await deps.execs.exec(acting, sandboxId, { argv, env, cwd: state.workdir, user: state.user || '0', timeoutMs: request.stepTimeoutMs, background: false, commandId: `${run.id}.l${i.line}` });
          await mustSucceed(i, result);
        }, allow);
      }
      case 'COPY':
      case 'ADD':
        return copyStep(i, state, vars);
      default:
        throw new RollboxError('internal', `instruction ${i.keyword} reached the builder`);
    }
  }

  async function copyStep(i: Instruction, state: StageState, vars: Map<string, string>) {
    const args = splitWords(expand(i.rest, vars, i.line), i.line);
    if (args.length < 2) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${i.line}: ${i.keyword} takes sources and a destination`);
    const sources = args.slice(0, -1);
    const destText = args.at(-1)!;
    const dest = path.posix.resolve(state.workdir, destText);
    const chown = i.flags.get('chown') && expand(i.flags.get('chown')!, vars, i.line);
    const chmod = i.flags.get('chmod');
    if (chmod !== undefined && !/^[0-7]{3,4}$/.test(chmod)) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${i.line}: --chmod takes an octal mode`);
    const from = i.flags.get('from');
    const intoDir = destText.endsWith('/') || sources.length > 1;
    // What is copied, named relative to the destination: context entries, or a tar read from a sandbox of another stage or image.
    type Item = { header: TarHeader; data?: Buffer };
    /**
     * One file (not a directory) copied to a destination without a trailing slash: the
     * destination is the file's new name, unless it is a directory already (then the file
     * goes into it, as Docker does); asked in the builder sandbox.
     */
    const place = async (sandboxId: string, items: Item[], single: boolean): Promise<{ into: string; items: Item[] }> => {
      const asFile = single && !intoDir && !(await isDirectory(sandboxId, dest));
      return {
        into: asFile ? path.posix.dirname(dest) : dest,
        items: items.map((item) => ({ ...item, header: { ...item.header, name: (asFile ? dest : path.posix.join(dest, item.header.name)).replace(/^\/+/, '') + (item.header.type === 'directory' ? '/' : '') } })),
      };
    };
    if (from === undefined) {
      const selected = selectSources(run.context, sources, ignored, i.line);
      const single = sources.length === 1 && selected.length === 1 && selected[0]!.entry.type !== 'directory' && run.context.get(sources[0]!.replace(/^\.?\/+/, ''))?.type !== 'directory';
      const items = selected.map(({ entry, target }) => ({ header: headerOf(entry, target), ...(entry.data ? { data: entry.data } : {}) }));
      const inputs = sha256(selected.map(({ entry, target }) => [target, entry.type, entry.mode, entry.linkname ?? '', entry.sha256 ?? '']));
      return layerStep(i, state, i.text, inputs, async (sandboxId) => writeEntries(i, sandboxId, await place(sandboxId, items, single), chown, chmod));
    }
    const source = await stackOf(from, i.line);
    // Read when the step runs (a cache miss only), from a sandbox of the source's layers.
    const read = async (): Promise<{ items: Item[]; single: boolean }> => {
      const items: Item[] = [];
      let single = sources.length === 1;
      const reader = await createBuilder(source.layers, `from-l${i.line}`, []);
      try {
        for (const s of sources) {
          const got = await deps.files.read(acting, reader, { path: path.posix.resolve('/', s), format: 'tar' });
          const extracted = await untar(got.body);
          if (extracted.some((e) => e.header.type === 'directory' && ['.', './'].includes(e.header.name))) single = false;
          for (const e of extracted) {
            const rel = path.posix.normalize(e.header.name).replace(/^\.(\/|$)/, '').replace(/\/+$/, '');
            if (rel) items.push({ header: { ...e.header, name: rel }, ...(e.data ? { data: e.data } : {}) });
          }
        }
      } finally {
        await deps.sandboxes.delete(acting, reader).catch(() => undefined);
      }
      return { items, single };
    };
    return layerStep(i, state, i.text, sha256(source.layers), async (sandboxId) => {
      const { items, single } = await read();
      await writeEntries(i, sandboxId, await place(sandboxId, items, single), chown, chmod);
    });
  }

  async function isDirectory(sandboxId: string, dir: string): Promise<boolean> {
    const r = await deps.execs.exec(acting, sandboxId, { argv: ['/.rollbox/busybox', 'test', '-d', dir], env: {}, user: '0', timeoutMs: 60_000, background: false });
    return r.exitCode === 0;
  }

  /**
   * The tar of a COPY's entries, owners and modes as the flags say, extracted at / in the
   * builder sandbox, into `into` made first (with its missing parents, owned as `--chown`
   * says, as BuildKit makes a COPY's destination).
   */
  async function writeEntries(i: Instruction, sandboxId: string, placed: { into: string; items: { header: TarHeader; data?: Buffer }[] }, chown: string | false | undefined, chmod: string | undefined): Promise<void> {
    const owner = chown ? await ownerIds(sandboxId, chown, 'chown') : undefined;
    await makeDirs(i, sandboxId, placed.into, owner);
    const owned = placed.items.map(({ header, data }) => ({ header: { ...header, uname: '', gname: '', ...(owner ? { uid: owner.uid, gid: owner.gid } : {}), ...(chmod && header.type !== 'symlink' ? { mode: parseInt(chmod, 8) } : {}) }, ...(data ? { data } : {}) }));
    await deps.files.write(acting, sandboxId, { path: '/' }, await packTar(owned), FILES_TAR_TYPE);
  }

  /**
   * `--chown=user[:group]` or a USER: numbers as they are, names from the stage's own
   * /etc/passwd and /etc/group (as Docker resolves them). Without a group, a `--chown` gives
   * the user's numeric id as its group id too; a USER its primary group (a uid without an
   * /etc/passwd entry: the uid, as BuildKit gives it).
   */
  async function ownerIds(sandboxId: string, spec: string, as: 'chown' | 'user'): Promise<{ uid: number; gid: number }> {
    const [user, group] = spec.split(':') as [string, string | undefined];
    const read = new Map<string, Promise<string[][]>>();
    const rows = (file: string): Promise<string[][]> => {
      if (!read.has(file)) read.set(file, deps.files.read(acting, sandboxId, { path: file, format: 'auto' }).catch(() => ({ body: Buffer.alloc(0) })).then((r) => r.body.toString('utf8').split('\n').map((l) => l.split(':'))));
      return read.get(file)!;
    };
    const what = as === 'chown' ? `--chown=${spec}` : `USER ${spec}`;
    const lookup = async (file: string, name: string): Promise<number> => {
      if (/^\d+$/.test(name)) return Number(name);
      const row = (await rows(file)).find((f) => f[0] === name);
      if (!row) throw new RollboxError('invalid_dockerfile', `${what}: no ${name} in the image's ${file}`);
      return Number(row[2]);
    };
    const uid = await lookup('/etc/passwd', user);
    if (group !== undefined) return { uid, gid: await lookup('/etc/group', group) };
    if (as === 'chown') return { uid, gid: uid };
    const entry = (await rows('/etc/passwd')).find((f) => f[2] === String(uid));
    return { uid, gid: entry && /^\d+$/.test(entry[3] ?? '') ? Number(entry[3]) : uid };
  }

  /** `dir` and its missing parents made (mode 755), those made owned by `owner`; what exists keeps its owner. */
  async function makeDirs(i: Instruction, sandboxId: string, dir: string, owner: { uid: number; gid: number } | undefined): Promise<void> {
    const script = 'set -ef; p=; IFS=/; for c in $1; do [ -n "$c" ] || continue; p="$p/$c"; [ -e "$p" ] && continue; /.rollbox/busybox mkdir -m 755 "$p"; [ -z "$2" ] || /.rollbox/busybox chown "$2" "$p"; done';
    const argv = ['/.rollbox/busybox', 'sh', '-c', script, 'sh', dir, owner ? `${owner.uid}:${owner.gid}` : ''];
    await mustSucceed(i, await deps.execs.exec(acting, sandboxId, { argv, env: {}, user: '0', timeoutMs: 60_000, background: false }));
  }

  /**
   * A step that makes a layer: from the cache by its key, else run in a fresh builder
   * sandbox over the stage's layers, whose writes are snapshotted into the step's layer.
   */
  async function layerStep(i: Instruction, state: StageState, text: string, inputs: string, work: (sandboxId: string) => Promise<void>, network: readonly NetworkAllowRule[] = []) {
    const { referencePaths } = request;
    // Reference paths change what the layer holds, so they are part of its key (absent when none).
    // v2: directories a WORKDIR under a USER or a COPY --chown makes are that user's (v1's were root's).
    const key = sha256({ v: 2, parents: state.layers, text, inputs, env: runEnv(state), user: state.user, workdir: state.workdir, ...(referencePaths.length ? { referencePaths } : {}) });
    return deps.cache.getOrRun(run.tenant, key, deps.stepLeaseMs, request.stepTimeoutMs + 120_000, async () => {
      const sandboxId = await createBuilder(state.layers, `l${i.line}`, network);
      try {
        await work(sandboxId);
        const layer = await deps.sandboxes.snapshot(acting, sandboxId, { exclude: [...SNAPSHOT_EXCLUDE, ...referencePaths] });
        return layer.digest;
      } finally {
        await deps.sandboxes.delete(acting, sandboxId).catch(() => undefined);
      }
    });
  }

  async function createBuilder(layers: LayerDigest[], role: string, network: readonly NetworkAllowRule[]): Promise<string> {
    const { sandbox } = await deps.sandboxes.create(
      acting,
      CreateSandboxRequest.parse({
        image: { base: layers[0]!, layers: layers.slice(1) },
        ...(request.resources ? { resources: request.resources } : {}),
        class: 'latency',
        network: network.length ? { mode: 'allowlist', allow: [...network] } : { mode: 'none', allow: [] },
        hiddenPaths: [],
        env: {},
        labels: { 'rollbox.build': run.id, 'rollbox.role': 'builder' },
        ttlSeconds: Math.ceil(request.stepTimeoutMs / 1000) + SANDBOX_TTL_MARGIN_SEC,
      }),
      `${run.id}.${role}.${Date.now()}`,
    );
    return sandbox.id;
  }

  async function stackOf(from: string, line: number): Promise<{ layers: LayerDigest[] }> {
    const stage = done.get(from.toLowerCase()) ?? (/^\d+$/.test(from) ? done.get(plan.parsed.stages[Number(from)]?.name ?? '') : undefined);
    if (stage) return stage;
    const base = await baseOf(deps, run.tenant, from, line);
    return base;
  }

  async function mustSucceed(i: Instruction, r: { exitCode: number | null; timedOut: boolean; stdout: string; stderr: string }): Promise<void> {
    if (!r.timedOut && r.exitCode === 0) return;
    const output = `${r.stdout}${r.stderr}`.slice(-OUTPUT_MAX_CHARS);
    throw new StepFailed(i.line, i.text, r.timedOut ? null : r.exitCode, output);
  }

  const result = last!;
  const env = [...result.env].map(([k, v]) => `${k}=${v}`);
  const config: ImageConfig = {
    Env: env,
    ...(result.workdir !== '/' ? { WorkingDir: result.workdir } : {}),
    ...(result.user ? { User: result.user } : {}),
    ...(result.entrypoint ? { Entrypoint: result.entrypoint } : {}),
    ...(result.cmd ? { Cmd: result.cmd } : {}),
  };
  return { layers: result.layers.map((digest) => ({ digest, diffId: digest, sizeBytes: 0 })), config, stepsRun, stepsCached };

  function runEnv(state: StageState): Record<string, string> {
    return { ...Object.fromEntries(state.args), ...Object.fromEntries(state.env) };
  }
}

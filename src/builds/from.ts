import { RollboxError, type ImageConfig, type LayerDigest } from '../api/index.ts';
import type { ImageRegistry, LayerRegistry } from '../registry/index.ts';
import { expand, splitWords, type Stage } from './dockerfile.ts';
import type { BuildPlan } from './plan.ts';

export interface FromDeps {
  images: Pick<ImageRegistry, 'get'>;
  layers: Pick<LayerRegistry, 'resolve'>;
  /** A FROM naming a registry reference: the image it was pulled into (pulled first if none holds it). */
  pull: (ref: string, tenant: string) => Promise<string>;
  /** An empty layer: the floor of a `FROM scratch` stage (a sandbox needs one layer). */
  emptyLayer: () => Promise<LayerDigest>;
}

/** What a stage has made so far: its layers (lowest first) and its image config. */
export interface StageState {
  layers: LayerDigest[];
  env: Map<string, string>;
  workdir: string;
  user: string;
  entrypoint?: string[];
  cmd?: string[];
  shell: string[];
  /** ARGs declared in the stage, with their values. */
  args: Map<string, string>;
}

/** What `docker build` gives a RUN when no ENV sets PATH. */
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** FROM: a stage built before, `scratch`, an image, a layer, or a registry reference (pulled). */
export async function fromOf(deps: FromDeps, tenant: string, stage: Stage, plan: BuildPlan, done: Map<string, StageState>): Promise<StageState> {
  const from = splitWords(expand(stage.from.rest, plan.globalArgs, stage.from.line), stage.from.line)[0]!;
  const previous = done.get(from.toLowerCase());
  if (previous) return { ...previous, layers: [...previous.layers], env: new Map(previous.env), args: new Map() };
  const base = from === 'scratch' ? { layers: [await deps.emptyLayer()] } : await baseOf(deps, tenant, from, stage.from.line);
  const env = new Map((base.config?.Env ?? []).map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)] as [string, string]));
  if (!env.has('PATH')) env.set('PATH', DEFAULT_PATH);
  return {
    layers: [...base.layers],
    env,
    workdir: base.config?.WorkingDir ?? '/',
    user: base.config?.User ?? '',
    ...(base.config?.Entrypoint ? { entrypoint: base.config.Entrypoint } : {}),
    ...(base.config?.Cmd ? { cmd: base.config.Cmd } : {}),
    shell: ['/bin/sh', '-c'],
    args: new Map(),
  };
}

/** What a FROM names, as the build's tenant sees it (its own images and layers, and the published ones). */
export async function baseOf(deps: FromDeps, tenant: string, from: string, line: number): Promise<{ layers: LayerDigest[]; config?: ImageConfig }> {
  const asImage = async (name: string) => {
    const image = await deps.images.get({ tenant, all: false }, name);
    return image ? { layers: image.layers.map((l) => l.digest), config: image.config } : undefined;
  };
  const named = /^[a-z0-9][a-z0-9._-]{0,127}$/.test(from) ? ((await asImage(from)) ?? (await deps.layers.resolve(from, { tenant, all: false }).then((l) => ({ layers: [l.digest] }), () => undefined))) : undefined;
  if (named) return named;
  const pulled = await deps.pull(from, tenant).catch((err: unknown) => {
    if (err instanceof RollboxError) throw new RollboxError(err.code, `Dockerfile line ${line}: FROM ${from}: ${err.message}`);
    throw err;
  });
  const image = await asImage(pulled);
  if (!image) throw new RollboxError('not_found', `Dockerfile line ${line}: FROM ${from}: its image went away`);
  return image;
}


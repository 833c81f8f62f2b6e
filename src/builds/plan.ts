import { RollboxError, type BuildRequest, type BuildStep } from '../api/index.ts';
import { expand, parseDockerfile, splitWords, unsupported, type Instruction, type ParsedDockerfile, type Stage } from './dockerfile.ts';

export interface BuildPlan {
  parsed: ParsedDockerfile;
  /** Stages built, in order (the target and those it copies from or starts from). */
  stages: Stage[];
  /** Every instruction of those stages, FROM first, as the build record lists them. */
  steps: BuildStep[];
  /** Global ARGs as FROM lines see them (defaults, then build args). */
  globalArgs: Map<string, string>;
}

/** The Dockerfile text a request names: its own, its steps joined, or a file of the context. */
export function dockerfileOf(request: BuildRequest, readContextFile: (name: string) => string | undefined): string {
  if (request.dockerfile !== undefined) return request.dockerfile;
  if (request.steps) return request.steps.join('\n');
  const name = request.dockerfilePath ?? 'Dockerfile';
  const text = readContextFile(name.replace(/^\.?\/+/, ''));
  if (text === undefined) throw new RollboxError('invalid_request', `the context holds no ${name}${request.context ? '' : ' (no context was given)'}`);
  return text;
}

/**
 * Parses and checks a build before it is queued, so a Dockerfile that does not parse, or
 * asks for what the builder cannot do, is refused at the request naming its line.
 */
export function planBuild(text: string, request: BuildRequest): BuildPlan {
  const parsed = parseDockerfile(text);
  const globalArgs = new Map<string, string>();
  for (const arg of parsed.globalArgs) {
    const [name, value] = argOf(arg, globalArgs);
    const given = request.buildArgs[name];
    if (given !== undefined) globalArgs.set(name, given);
    else if (value !== undefined) globalArgs.set(name, value);
  }
  const byName = new Map(parsed.stages.map((s) => [s.name, s]));
  const target = request.target ? byName.get(request.target.toLowerCase()) : parsed.stages.at(-1);
  if (!target) throw new RollboxError('invalid_request', `target: no stage named ${request.target}`);
  // The stages the target needs, each before the stages that use it.
  const needed = new Set<Stage>();
  const visit = (stage: Stage, path: Stage[]) => {
    if (needed.has(stage)) return;
    if (path.includes(stage)) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${stage.from.line}: stage ${stage.name} depends on itself`);
    const from = splitWords(expand(stage.from.rest, globalArgs, stage.from.line), stage.from.line)[0]!.toLowerCase();
    const base = byName.get(from);
    if (base && base.index < stage.index) visit(base, [...path, stage]);
    for (const named of copiedFrom(stage)) visit(named, [...path, stage]);
    needed.add(stage);
  };
  /** The earlier stages a stage's `COPY --from` names (a later one is refused: every stage is checked, used or not). */
  const copiedFrom = (stage: Stage): Stage[] =>
    stage.instructions.flatMap((i) => {
      checkInstruction(i);
      const source = i.flags.get('from');
      if (i.keyword !== 'COPY' || source === undefined) return [];
      const named = byName.get(source.toLowerCase()) ?? (/^\d+$/.test(source) ? parsed.stages[Number(source)] : undefined);
      if (named && named.index >= stage.index) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${i.line}: COPY --from=${source} names a stage that is not before this one`);
      return named ? [named] : [];
    });
  for (const stage of parsed.stages) copiedFrom(stage);
  visit(target, []);
  const stages = [...needed];
  const steps = stages.flatMap((s) => [s.from, ...s.instructions].map((i): BuildStep => ({ line: i.line, stage: s.name, text: i.text, state: 'pending' })));
  return { parsed, stages, steps, globalArgs };
}

/** `ARG NAME[=default]`: its name and default (expanded against what is in scope). */
export function argOf(i: Instruction, scope: ReadonlyMap<string, string>): [string, string | undefined] {
  const words = splitWords(expand(i.rest, scope, i.line), i.line);
  if (words.length !== 1) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${i.line}: ARG takes one NAME[=default]`);
  const eq = words[0]!.indexOf('=');
  const name = eq < 0 ? words[0]! : words[0]!.slice(0, eq);
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new RollboxError('invalid_dockerfile', `Dockerfile line ${i.line}: ARG name ${JSON.stringify(name)} is not [A-Za-z_][A-Za-z0-9_]*`);
  return [name, eq < 0 ? undefined : words[0]!.slice(eq + 1)];
}

/** What the parser could not tell: ADD from a URL or of an archive (extracted by Docker), COPY --link. */
function checkInstruction(i: Instruction): void {
  if (i.keyword !== 'ADD' && i.keyword !== 'COPY') return;
  if (i.flags.has('link') && i.flags.get('link') !== 'false') throw unsupported(i.line, `${i.keyword} --link is not supported`);
  if (i.keyword !== 'ADD') return;
  const sources = splitWords(i.rest, i.line).slice(0, -1);
  for (const s of sources) {
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(s) || s.startsWith('git@')) throw unsupported(i.line, `ADD from a URL (${s}) is not supported: fetch it in a RUN step under the build's network allowlist`);
    if (/\.(tar|tgz|tar\.(gz|bz2|xz|zst)|tbz2|txz)$/i.test(s)) throw unsupported(i.line, `ADD of an archive (${s}) would be extracted by Docker; this builder does not extract: COPY it and extract it in a RUN step`);
  }
}

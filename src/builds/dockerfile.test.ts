import { describe, expect, it } from 'vitest';
import { RollboxError } from '../api/index.ts';
import { dockerignore } from './context.ts';
import { expand, parseDockerfile, splitPairs, splitWords } from './dockerfile.ts';
import { planBuild } from './plan.ts';

const codeOf = (fn: () => unknown) => {
  try {
    fn();
  } catch (err) {
    return err instanceof RollboxError ? `${err.code}: ${err.message}` : String(err);
  }
  return 'no error';
};

describe('Dockerfile parsing', () => {
  it('joins continuations, drops comment lines inside them, and keeps flags', () => {
    const parsed = parseDockerfile('FROM busybox AS a\nRUN echo 1 \\\n  # note\n  && echo 2\nCOPY --chown=1:2 --from=a /x /y\n');
    const [run, copy] = parsed.stages[0]!.instructions;
    expect(run).toMatchObject({ keyword: 'RUN', line: 2, rest: 'echo 1   && echo 2' });
    expect(copy!.flags).toEqual(new Map([['chown', '1:2'], ['from', 'a']]));
    expect(copy!.text).toBe('COPY --chown=1:2 --from=a /x /y');
  });

  it('refuses what does not parse and what it cannot honour, naming the line', () => {
    expect(codeOf(() => parseDockerfile('FROM a\n\nNOPE x'))).toBe('invalid_dockerfile: Dockerfile line 3: unknown instruction "NOPE"');
    expect(codeOf(() => parseDockerfile('RUN true\nFROM a'))).toMatch(/^invalid_dockerfile: Dockerfile line 1: RUN before the first FROM/);
    expect(codeOf(() => parseDockerfile('FROM a\nRUN --mount=type=secret,id=x true'))).toMatch(/^build_unsupported: Dockerfile line 2: RUN --mount/);
    expect(codeOf(() => parseDockerfile('FROM a\nONBUILD RUN x'))).toMatch(/^build_unsupported: Dockerfile line 2: ONBUILD/);
    expect(codeOf(() => parseDockerfile('FROM a\nRUN <<EOF\nx\nEOF'))).toMatch(/^build_unsupported: Dockerfile line 2: heredocs/);
    expect(codeOf(() => parseDockerfile('FROM a\nENV'))).toMatch(/line 2: ENV needs arguments/);
    const plan = (text: string) => planBuild(text, { name: 'x', buildArgs: {}, network: { allow: [] }, stepTimeoutMs: 1000, referencePaths: [] });
    expect(codeOf(() => plan('FROM a\nADD https://example.com/x /x'))).toMatch(/^build_unsupported: Dockerfile line 2: ADD from a URL/);
    expect(codeOf(() => plan('FROM a AS one\nCOPY --from=two /x /y\nFROM a AS two'))).toMatch(/line 2: COPY --from=two names a stage that is not before/);
  });

  it('plans only the stages the target needs', () => {
    const plan = planBuild('ARG V=1\nFROM a AS unused\nRUN x\nFROM a AS lib\nRUN y\nFROM b\nCOPY --from=lib /y /y', { name: 'x', buildArgs: {}, network: { allow: [] }, stepTimeoutMs: 1000, referencePaths: [] });
    expect(plan.stages.map((s) => s.name)).toEqual(['lib', '2']);
    expect(plan.steps.map((s) => s.line)).toEqual([4, 5, 6, 7]);
    expect(plan.globalArgs.get('V')).toBe('1');
  });

  it('substitutes variables as Docker does and splits words and pairs', () => {
    const vars = new Map([['A', 'x'], ['E', '']]);
    expect(expand('$A ${A}/${B:-d} ${E:-e} ${E-f} ${A:+set} ${B+no} \\$A', vars, 1)).toBe('x x/d e  set  \\$A');
    expect(splitWords('a "b c" \'d e\' f\\ g \\$A', 1)).toEqual(['a', 'b c', 'd e', 'f g', '$A']);
    expect(splitWords('["a b", "c"]', 1)).toEqual(['a b', 'c']);
    expect(splitPairs('A=1 B="two words"', 1, 'ENV')).toEqual([['A', '1'], ['B', 'two words']]);
    expect(splitPairs('A one two', 1, 'ENV')).toEqual([['A', 'one two']]);
  });
});

describe('.dockerignore', () => {
  it('excludes by pattern and its directories, with exceptions, the last match deciding', () => {
    const ignored = dockerignore('# c\n*.log\n!keep.log\nsecret/\n**/tmp\n/build\n');
    expect(['a.log', 'keep.log', 'secret/x', 'secret', 'a/b/tmp/c', 'tmp', 'build/out', 'src/a.log', 'src/ok'].filter(ignored)).toEqual(['a.log', 'secret/x', 'secret', 'a/b/tmp/c', 'tmp', 'build/out']);
  });
});

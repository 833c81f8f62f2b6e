import { DockerfileParser } from 'dockerfile-ast';
import { RollboxError } from '../api/index.ts';

/** One instruction as written: its keyword, its 1-based first line, its flags and the rest (continuations joined, comment lines dropped). */
export interface Instruction {
  keyword: string;
  line: number;
  /** The instruction as written, continuations joined: what the build log and the cache key show. */
  text: string;
  flags: Map<string, string>;
  /** What follows the flags. */
  rest: string;
}

export interface Stage {
  index: number;
  /** `AS name`, else its index as text. */
  name: string;
  from: Instruction;
  instructions: Instruction[];
}

export interface ParsedDockerfile {
  /** ARGs before the first FROM: only FROM lines see them. */
  globalArgs: Instruction[];
  stages: Stage[];
}

const KNOWN = new Set(['FROM', 'RUN', 'COPY', 'ADD', 'ENV', 'ARG', 'WORKDIR', 'USER', 'LABEL', 'ENTRYPOINT', 'CMD', 'EXPOSE', 'MAINTAINER', 'SHELL', 'HEALTHCHECK', 'ONBUILD', 'VOLUME', 'STOPSIGNAL']);
/** Instructions Docker knows and this builder cannot honour: refused, never skipped. */
const UNSUPPORTED: Record<string, string> = {
  HEALTHCHECK: 'rollbox images carry no health check',
  ONBUILD: 'rollbox images carry no build triggers',
  VOLUME: 'rollbox sandboxes mount no volumes from an image config',
  STOPSIGNAL: 'rollbox images carry no stop signal',
};
/** Flags each instruction takes here; any other is refused naming the line (RUN --mount among them). */
const FLAGS: Record<string, readonly string[]> = {
  FROM: ['platform'],
  COPY: ['from', 'chown', 'chmod', 'link'],
  ADD: ['chown', 'chmod', 'link'],
  RUN: [],
};

export const dockerfileError = (line: number, message: string) => new RollboxError('invalid_dockerfile', `Dockerfile line ${line}: ${message}`);
export const unsupported = (line: number, message: string) => new RollboxError('build_unsupported', `Dockerfile line ${line}: ${message}`);

/**
 * A Dockerfile into its stages. The text is split by dockerfile-ast (continuations, the
 * escape directive, comments); each instruction is then held to what `docker build` accepts
 * (a known keyword with arguments, known flags) and to what this builder can honour.
 */
export function parseDockerfile(text: string): ParsedDockerfile {
  const parsed = DockerfileParser.parse(text);
  const escape = parsed.getEscapeCharacter();
  const globalArgs: Instruction[] = [];
  const stages: Stage[] = [];
  for (const node of parsed.getInstructions()) {
    const keyword = node.getKeyword().toUpperCase();
    const line = node.getRange().start.line + 1;
    if (!KNOWN.has(keyword)) throw dockerfileError(line, `unknown instruction ${JSON.stringify(node.getInstruction())}`);
    if (UNSUPPORTED[keyword]) throw unsupported(line, `${keyword} is not supported: ${UNSUPPORTED[keyword]}`);
    // The whole instruction after its keyword: dockerfile-ast's argument content leaves the flags out.
    const raw = joinContinuations(node.getTextContent().slice(node.getInstruction().length), escape);
    if (/^\s*<</.test(raw) || /(^|\s)<<-?["']?[A-Za-z_]/.test(raw.split('\n')[0] ?? '')) throw unsupported(line, 'heredocs are not supported');
    const { flags, rest } = splitFlags(raw, line, keyword);
    if (!rest.trim()) throw dockerfileError(line, `${keyword} needs arguments`);
    const instruction: Instruction = { keyword, line, text: `${node.getInstruction()} ${raw.trim()}`, flags, rest: rest.trim() };
    if (keyword === 'FROM') {
      const words = splitWords(instruction.rest, line);
      if (words.length !== 1 && !(words.length === 3 && words[1]!.toUpperCase() === 'AS')) throw dockerfileError(line, 'FROM takes an image and optionally AS name');
      const name = words[2]?.toLowerCase() ?? String(stages.length);
      if (words[2] && !/^[a-z][a-z0-9._-]*$/.test(name)) throw dockerfileError(line, `stage name ${JSON.stringify(words[2])} is not [a-z][a-z0-9._-]*`);
      if (words[2] && stages.some((s) => s.name === name)) throw dockerfileError(line, `stage name ${name} is used twice`);
      stages.push({ index: stages.length, name, from: instruction, instructions: [] });
    } else if (stages.length === 0) {
      if (keyword !== 'ARG') throw dockerfileError(line, `${keyword} before the first FROM (only ARG may come before it)`);
      globalArgs.push(instruction);
    } else stages.at(-1)!.instructions.push(instruction);
  }
  if (stages.length === 0) throw dockerfileError(1, 'no FROM instruction');
  return { globalArgs, stages };
}

/** Continuation lines joined (escape + newline removed), comment lines inside them dropped, as the Docker parser does. */
function joinContinuations(raw: string, escape: string): string {
  const lines = raw.split('\n');
  const kept = [lines[0]!, ...lines.slice(1).filter((l) => !l.trimStart().startsWith('#'))].join('\n');
  const esc = escape.replace(/[\\^$.*+?()[\]{}|]/g, '\\$&');
  return kept.replace(new RegExp(`${esc}[ \\t]*\\r?\\n`, 'g'), '').replace(/\r?\n/g, ' ');
}

function splitFlags(raw: string, line: number, keyword: string): { flags: Map<string, string>; rest: string } {
  const flags = new Map<string, string>();
  let rest = raw.trimStart();
  for (let m = /^--([A-Za-z-]+)(?:=(\S*))?\s*/.exec(rest); m; m = /^--([A-Za-z-]+)(?:=(\S*))?\s*/.exec(rest)) {
    const [whole, name, value] = m;
    if (name === 'mount' && keyword === 'RUN') throw unsupported(line, 'RUN --mount is not supported (no cache, secret or bind mounts in builder sandboxes)');
    if (!(FLAGS[keyword] ?? []).includes(name!)) {
      if (keyword in FLAGS) throw unsupported(line, `${keyword} --${name} is not supported`);
      break; // an instruction without flags: `--x` is its argument (ENV --x=1 is a parse error below, as in Docker)
    }
    flags.set(name!, value ?? 'true');
    rest = rest.slice(whole!.length);
  }
  return { flags, rest };
}

/**
 * Words as Docker splits them for COPY, ADD, FROM, USER...: the JSON form (`["a", "b"]`)
 * or whitespace-separated words with quotes and backslash escapes.
 */
export function splitWords(text: string, line: number): string[] {
  const trimmed = text.trim();
  if (trimmed.startsWith('[')) {
    const json = jsonArray(trimmed);
    if (json) return json;
  }
  const words: string[] = [];
  let word = '';
  let inWord = false;
  let quote: '"' | "'" | undefined;
  for (let i = 0; i < trimmed.length; i++) {
    const ch = trimmed[i]!;
    if (quote) {
      if (ch === quote) quote = undefined;
      else if (ch === '\\' && quote === '"' && i + 1 < trimmed.length) word += trimmed[++i];
      else word += ch;
    } else if (ch === '"' || ch === "'") {
      quote = ch;
      inWord = true;
    } else if (ch === '\\' && i + 1 < trimmed.length) {
      word += trimmed[++i];
      inWord = true;
    } else if (/\s/.test(ch)) {
      if (inWord) words.push(word);
      word = '';
      inWord = false;
    } else {
      word += ch;
      inWord = true;
    }
  }
  if (quote) throw dockerfileError(line, `unterminated ${quote} quote`);
  if (inWord) words.push(word);
  return words;
}

/** The JSON (exec) form, or undefined when the text is not a JSON array of strings (then it is the shell form, as in Docker). */
export function jsonArray(text: string): string[] | undefined {
  try {
    const value: unknown = JSON.parse(text);
    return Array.isArray(value) && value.every((v) => typeof v === 'string') ? value : undefined;
  } catch {
    return undefined;
  }
}

/** `KEY=value KEY2="v w"`, or the old `KEY value` form (one pair), as ENV and LABEL take them. */
export function splitPairs(text: string, line: number, keyword: string): [string, string][] {
  const words = splitWords(text, line);
  if (words.length > 0 && !words[0]!.includes('=')) {
    if (keyword === 'LABEL' || words.length < 2) throw dockerfileError(line, `${keyword} takes KEY=value pairs`);
    const value = text.trim().slice(text.trim().search(/\s/)).trim();
    return [[words[0]!, splitWords(value, line).join(' ')]];
  }
  return words.map((w) => {
    const eq = w.indexOf('=');
    if (eq <= 0) throw dockerfileError(line, `${keyword}: ${JSON.stringify(w)} is not KEY=value`);
    return [w.slice(0, eq), w.slice(eq + 1)];
  });
}

/**
 * `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME-word}`, `${NAME:+word}`, `${NAME+word}`
 * replaced from `vars` as Docker does before splitting words; `\$` is a literal `$`.
 * Quotes are kept (splitWords removes them afterwards), so a value holding spaces stays one word when quoted.
 */
export function expand(text: string, vars: ReadonlyMap<string, string>, line: number): string {
  let out = '';
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]!;
    if (ch === '\\' && text[i + 1] === '$') {
      out += '\\$';
      i++;
      continue;
    }
    if (ch !== '$') {
      out += ch;
      continue;
    }
    const simple = /^[A-Za-z_][A-Za-z0-9_]*/.exec(text.slice(i + 1));
    if (simple) {
      out += vars.get(simple[0]) ?? '';
      i += simple[0].length;
      continue;
    }
    if (text[i + 1] !== '{') {
      out += ch;
      continue;
    }
    const close = text.indexOf('}', i + 2);
    if (close < 0) throw dockerfileError(line, 'unterminated ${');
    const inner = /^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])(.*))?$/s.exec(text.slice(i + 2, close));
    if (!inner) throw dockerfileError(line, `bad substitution \${${text.slice(i + 2, close)}}`);
    const [, name, op, word = ''] = inner;
    const value = vars.get(name!);
    const set = op?.startsWith(':') ? value !== undefined && value !== '' : value !== undefined;
    if (!op) out += value ?? '';
    else if (op.endsWith('-')) out += set ? value! : expand(word, vars, line);
    else out += set ? expand(word, vars, line) : '';
    i = close;
  }
  return out;
}

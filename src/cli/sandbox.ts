/**
 * `rollbox sandbox fork`: N children from a sandbox's current state, or from a snapshot
 * (a `sha256:` digest), on a gateway (--url / ROLLBOX_URL, --token / ROLLBOX_TOKEN with
 * scope sandbox:create). Prints the children in order (id, state, or the coded refusal),
 * or the answer as JSON; exits 1 when no child could be made.
 */
import type { Command } from 'commander';
import { ForkRequest, type ForkResult } from '../api/index.ts';
import { ForksClient } from '../client/index.ts';
import { CliError, connect, out, reported, table, withConnection, type ConnectionFlags } from './common.ts';

interface ForkFlags extends ConnectionFlags {
  count: string;
  label?: string[];
  ttl?: string;
  memoryMib?: string;
  cpuMillis?: string;
  diskMib?: string;
  idempotencyKey?: string;
  snapshot?: boolean | string;
  processes?: boolean;
  json?: boolean;
}

function labelsOf(pairs: readonly string[]): Record<string, string> {
  return Object.fromEntries(
    pairs.map((pair) => {
      const eq = pair.indexOf('=');
      if (eq < 1) throw new CliError('invalid_request', `--label ${pair}: give key=value`);
      return [pair.slice(0, eq), pair.slice(eq + 1)];
    }),
  );
}

const integer = (flag: string, value: string | undefined): number | undefined => {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value)) throw new CliError('invalid_request', `${flag} ${value}: not a whole number`);
  return Number(value);
};

/** The request the flags describe, checked against the API's own schema before anything is sent. */
function requestOf(flags: ForkFlags): ForkRequest {
  const resources = { cpuMillis: integer('--cpu-millis', flags.cpuMillis), memoryMiB: integer('--memory-mib', flags.memoryMib), diskMiB: integer('--disk-mib', flags.diskMib) };
  const given = Object.fromEntries(Object.entries(resources).filter(([, v]) => v !== undefined));
  const parsed = ForkRequest.safeParse({
    count: integer('--count', flags.count),
    ...(flags.label?.length ? { labels: labelsOf(flags.label) } : {}),
    ...(flags.ttl !== undefined ? { ttlSeconds: integer('--ttl', flags.ttl) } : {}),
    ...(Object.keys(given).length ? { resources: given } : {}),
    ...(flags.snapshot !== undefined ? { snapshot: typeof flags.snapshot === 'string' ? { name: flags.snapshot } : {} } : {}),
    ...(flags.processes !== undefined ? { processes: flags.processes } : {}),
  });
  if (!parsed.success) throw new CliError('invalid_request', parsed.error.issues.map((i) => `${i.path.join('.') || 'request'}: ${i.message}`).join('; '));
  return parsed.data;
}

function summary(result: ForkResult): string {
  const frozen = result.parentFrozenMs === undefined ? 'not frozen' : `frozen ${result.parentFrozenMs.toFixed(1)} ms`;
  const at = [result.forkPoint && `fork point ${result.forkPoint}`, result.forkLayer && `layer ${result.forkLayer}`].filter(Boolean).join(', ');
  const kept = result.processes ? `, processes kept${result.detachedCommands?.length ? ` (${result.detachedCommands.join(', ')} detached in the children)` : ''}` : '';
  const head = `forked ${result.parent} (${result.parentKind}, ${frozen}${kept}) at ${at}: ${result.created} created, ${result.refused} refused\n`;
  const rows = [['#', 'ID', 'STATE', 'ERROR']];
  result.children.forEach((c, i) => rows.push([String(i), c.id ?? '-', c.state ?? '-', c.error ? `${c.error.code}: ${c.error.message}` : '']));
  return head + table(rows);
}

export function registerSandboxCommands(program: Command): void {
  const sandbox = program.command('sandbox').description('sandboxes: fork');
  withConnection(
    sandbox
      .command('fork')
      .description('fork SOURCE (a sandbox id, or a snapshot digest sha256:...) into --count children; prints each child in order')
      .argument('<source>', 'sandbox id (running, paused or hibernated) or snapshot digest')
      .requiredOption('--count <n>', 'children, 1-64')
      .option('--label <key=value...>', "children's labels (default: the parent's)")
      .option('--ttl <seconds>', "children's TTL in seconds (default: the parent's)")
      .option('--cpu-millis <n>', "children's CPU limit")
      .option('--memory-mib <n>', "children's memory limit")
      .option('--disk-mib <n>', "children's disk")
      .option('--idempotency-key <key>', 'send again with the same key: the same children come back')
      .option('--snapshot [name]', 'also keep the fork point as a snapshot layer (named, if a name is given), to fork from it again later')
      .option('--processes', "the children keep the parent's processes (a microVM's default)")
      .option('--no-processes', 'files only: each child a fresh sandbox over the parent\'s files')
      .option('--json', 'print the answer as JSON'),
    'sandbox:create',
  ).action(
    reported(async (source: string, flags: ForkFlags) => {
      const request = requestOf(flags);
      const forks = new ForksClient(connect(flags));
      const options = flags.idempotencyKey ? { idempotencyKey: flags.idempotencyKey } : {};
      const result = source.startsWith('sha256:') ? await forks.forkSnapshot(source, request, options) : await forks.fork(source, request, options);
      await out(flags.json ? `${JSON.stringify(result)}\n` : summary(result));
    }),
  );
}

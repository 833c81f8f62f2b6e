/**
 * `rollbox rollout submit | follow | show`: hosted rollouts from the trainer's side (--url /
 * ROLLBOX_URL, --token / ROLLBOX_TOKEN with scope rollout:submit). Follow reads the batch's
 * events stream (server-sent, resumed from its last event id after a drop) and writes one
 * NDJSON line per finished rollout to stdout ({line, trajectory}), progress to stderr.
 */
import fs from 'node:fs';
import type { Command } from 'commander';
import { RolloutsClient } from '../client/index.ts';
import { CliError, connect, out, reported, withConnection as withConnectionFor, type ConnectionFlags } from './common.ts';

function withConnection(command: Command): Command {
  return withConnectionFor(command, 'rollout:submit');
}

function clientOf(flags: ConnectionFlags): RolloutsClient {
  return new RolloutsClient(connect(flags));
}

async function readRequest(file: string): Promise<unknown> {
  let text = '';
  if (file !== '-') text = await fs.promises.readFile(file, 'utf8');
  else for await (const chunk of process.stdin) text += String(chunk);
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new CliError('invalid_request', `${file}: not JSON: ${(err as Error).message}`);
  }
}

export function registerRolloutCommands(program: Command): void {
  const rollout = program.command('rollout').description('hosted rollouts: submit one, follow a batch\'s finished rollouts with their trajectories, show one');

  withConnection(
    rollout
      .command('submit')
      .description('submit FILE (JSON: {"task": {...agent, model...}, ...batch options}; - for stdin); prints the batch of one task as JSON')
      .argument('<file>', 'the rollout request'),
  ).action(
    reported(async (file: string, flags: ConnectionFlags) => {
      const request = (await readRequest(file)) as Parameters<RolloutsClient['submitRollout']>[0];
      await out(`${JSON.stringify(await clientOf(flags).submitRollout(request), null, 2)}\n`);
    }),
  );

  withConnection(
    rollout
      .command('follow')
      .description('write each finished rollout of the batch as {line, trajectory} (NDJSON) to stdout until the batch has ended, as the gateway pushes them (server-sent events, resumed after a dropped connection); each line\'s cursor resumes after it')
      .argument('<batchId>', 'batch id (a rollout submit\'s, or any batch with agent tasks)')
      .option('--after <cursor>', 'only rollouts after this cursor (the last line\'s line.cursor)'),
  ).action(
    reported(async (batchId: string, flags: ConnectionFlags & { after?: string }) => {
      // A closed pipe (`| head`) ends the command quietly.
      process.stdout.on('error', (err: NodeJS.ErrnoException) => {
        if (err.code === 'EPIPE') process.exit(0);
      });
      let count = 0;
      for await (const { line, trajectory } of clientOf(flags).streamRollouts(batchId, { after: flags.after })) {
        await out(`${JSON.stringify({ line, trajectory })}\n`);
        count++;
        process.stderr.write(`rollout ${line.rollout?.id ?? line.customId}: ${line.status}${line.grade ? ` (grade ${line.grade.passed ? 'passed' : 'failed'})` : ''}, cursor ${line.cursor}\n`);
      }
      process.stderr.write(`batch ${batchId} ended: ${count} rollouts\n`);
    }),
  );

  withConnection(
    rollout
      .command('show')
      .description('the rollout attempt as JSON: where it ran, its task state, its model usage')
      .argument('<rolloutId>', 'rollout id (a result line\'s rollout.id)')
      .option('--trajectory', 'its trajectory instead: model calls and task-sandbox commands in order'),
  ).action(
    reported(async (id: string, flags: ConnectionFlags & { trajectory?: boolean }) => {
      const client = clientOf(flags);
      await out(`${JSON.stringify(flags.trajectory ? await client.rolloutTrajectory(id) : await client.getRollout(id), null, 2)}\n`);
    }),
  );
}

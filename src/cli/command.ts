/**
 * `rollbox command signal | stdin`: input for a running command of a sandbox, by its id
 * (--url / ROLLBOX_URL, --token / ROLLBOX_TOKEN with scope sandbox:exec). `stdin` sends
 * --data, or this process's own stdin in pieces as it arrives (then closes the command's
 * stdin at its end): `tail -f log | rollbox command stdin SBX CMD`.
 */
import type { Command } from 'commander';
import { SIGNAL_NUMBERS, SignalName } from '../api/index.ts';
import { CliError, connect, out, reported, withConnection, type ConnectionFlags } from './common.ts';

/** One stdin request carries at most this much (the API's cap is 1 MiB of text). */
const STDIN_PIECE_CHARS = 256 * 1024;

export function registerCommandCommands(program: Command): void {
  const command = program.command('command').description('signal a running command, or feed it stdin, by its command id');

  withConnection(command.command('signal'), 'sandbox:exec')
    .description(`send a signal to a running command's process group (${Object.keys(SIGNAL_NUMBERS).join(', ')})`)
    .argument('<sandbox>', 'sandbox id')
    .argument('<commandId>', 'the command id')
    .argument('[signal]', 'signal name', 'TERM')
    .action(
      reported(async (sandbox: string, commandId: string, signal: string, flags: ConnectionFlags) => {
        const name = SignalName.safeParse(signal.toUpperCase().replace(/^SIG/, ''));
        if (!name.success) throw new CliError('invalid_request', `unknown signal ${signal}: one of ${Object.keys(SIGNAL_NUMBERS).join(', ')}`);
        await connect(flags).signalCommand(sandbox, commandId, name.data);
        await out(`sent ${name.data} to ${commandId}\n`);
      }),
    );

  withConnection(command.command('stdin'), 'sandbox:exec')
    .description('write to the stdin of a running command started with stdinOpen: --data, or this process\'s stdin until its end')
    .argument('<sandbox>', 'sandbox id')
    .argument('<commandId>', 'the command id')
    .option('--data <text>', 'text to write (default: read this process\'s stdin)')
    .option('--eof', 'close the command\'s stdin after --data (reading stdin closes it at its end)')
    .action(
      reported(async (sandbox: string, commandId: string, flags: ConnectionFlags & { data?: string; eof?: boolean }) => {
        const client = connect(flags);
        if (flags.data !== undefined) {
          await client.writeStdin(sandbox, commandId, flags.data, { eof: flags.eof === true });
          return;
        }
        process.stdin.setEncoding('utf8');
        for await (const chunk of process.stdin as AsyncIterable<string>) {
          for (let off = 0; off < chunk.length; off += STDIN_PIECE_CHARS) await client.writeStdin(sandbox, commandId, chunk.slice(off, off + STDIN_PIECE_CHARS));
        }
        await client.writeStdin(sandbox, commandId, '', { eof: true });
      }),
    );
}

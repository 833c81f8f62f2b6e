import { RollboxError } from '../../api/index.ts';
import type { CommandChannel, PtySize } from '../init/index.ts';
import type { RuntimeContext, SandboxRecord } from './context.ts';
import { checkSandboxId } from './layout.ts';

/**
 * A durable command whose connection this process holds or is opening; `stdinOpen` until
 * its stdin is closed. Listed before the init has taken it, because the command log says
 * `running` from then on: stdin and signals sent in that window wait for `opened`.
 */
export interface LiveCommand {
  /** The command's connection once the init took it; undefined if it never did. */
  opened: Promise<CommandChannel | undefined>;
  stdinOpen: boolean;
  /** It runs on a terminal (resizeCommand applies). */
  pty: boolean;
  /** This process let go of it (detach): the command runs on for the next worker to collect. */
  released: boolean;
  release(): void;
}

/** Durable commands whose connection this process holds, by sandbox record and command id. */
const liveCommands = new WeakMap<SandboxRecord, Map<string, LiveCommand>>();

/** The durable commands held for one sandbox (its map is made on first use). */
export function liveOf(rec: SandboxRecord): Map<string, LiveCommand> {
  let live = liveCommands.get(rec);
  if (!live) liveCommands.set(rec, (live = new Map()));
  return live;
}

/** The sandbox of that id on this host. */
export function recordOf(ctx: RuntimeContext, sandboxId: string): SandboxRecord {
  checkSandboxId(sandboxId);
  const rec = ctx.sandboxes.get(sandboxId);
  if (!rec) throw new RollboxError('not_found', `sandbox ${sandboxId} is not on this host`);
  return rec;
}

export async function signalCommand(ctx: RuntimeContext, sandboxId: string, commandId: string, signo: number): Promise<boolean> {
  const channel = await liveOf(recordOf(ctx, sandboxId)).get(commandId)?.opened;
  channel?.signal(signo);
  return channel !== undefined;
}

export async function writeCommandStdin(ctx: RuntimeContext, sandboxId: string, commandId: string, data: Buffer, eof: boolean): Promise<boolean> {
  const live = liveOf(recordOf(ctx, sandboxId)).get(commandId);
  if (!live?.stdinOpen) return false;
  if (eof) live.stdinOpen = false;
  const channel = await live.opened;
  if (!channel) return false;
  if (data.length > 0) await channel.writeStdin(data);
  if (eof) channel.closeStdin();
  return true;
}

/** A running pty command's new window size; false when no pty command of that id runs here. */
export async function resizeCommand(ctx: RuntimeContext, sandboxId: string, commandId: string, size: PtySize): Promise<boolean> {
  const live = liveOf(recordOf(ctx, sandboxId)).get(commandId);
  if (!live?.pty) return false;
  const channel = await live.opened;
  channel?.resize(size);
  return channel !== undefined;
}

/** This process lets go of every durable command it holds (a worker that stops and leaves its sandboxes running). */
export function releaseCommands(ctx: RuntimeContext): void {
  for (const live of ctx.commandChannels) live.release();
}

import fs from 'node:fs/promises';
import path from 'node:path';

/**
 * Commands a sandbox hibernated whole with (a microVM: they run on in its saved guest): the
 * exec messages the hibernating host had taken for them, kept in the image, so the host that
 * wakes the sandbox takes them into its own inbox and attaches to the commands as a
 * restarted host does to its own (OpHandler.resume): same output, stdin, signals, result.
 */
const CARRIED_COMMANDS_FILE = 'commands.json';

export async function keepCarriedCommands(imageDir: string, raws: readonly string[]): Promise<void> {
  const file = path.join(imageDir, CARRIED_COMMANDS_FILE);
  await fs.writeFile(`${file}.tmp`, JSON.stringify(raws));
  await fs.rename(`${file}.tmp`, file);
}

/** The raw exec messages kept with the image; none when it has no file (no command ran, or an older host saved it). */
export async function readCarriedCommands(imageDir: string): Promise<string[]> {
  try {
    const raws = JSON.parse(await fs.readFile(path.join(imageDir, CARRIED_COMMANDS_FILE), 'utf8')) as unknown;
    return Array.isArray(raws) ? raws.filter((r): r is string => typeof r === 'string') : [];
  } catch {
    return [];
  }
}

/** The command id of a carried exec message (for settling it when the wake fails). */
export function carriedCommandOf(raw: string): { sandboxId: string; commandId: string } | undefined {
  try {
    const m = JSON.parse(raw) as { sandboxId?: unknown; commandId?: unknown };
    return typeof m.sandboxId === 'string' && typeof m.commandId === 'string' ? { sandboxId: m.sandboxId, commandId: m.commandId } : undefined;
  } catch {
    return undefined;
  }
}

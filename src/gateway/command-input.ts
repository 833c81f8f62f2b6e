import { setTimeout as sleep } from 'node:timers/promises';
import { RollboxError, newId, type CommandInputResult, type PtySize } from '../api/index.ts';
import { requireScope, type Principal } from '../iam/index.ts';
import type { CommandLog, SandboxRegistry } from '../registry/index.ts';
import { toRollboxError, type NodeRequests } from './node-requests.ts';

/** What can reach a running command: a signal to its process group, a piece of stdin, a pty's new size. */
export type CommandInput =
  | { kind: 'signal'; commandId: string; signo: number }
  | { kind: 'stdin'; commandId: string; data: string; eof: boolean }
  | { kind: 'resize'; commandId: string; size: PtySize };

export interface CommandInputDeps {
  registry: SandboxRegistry;
  commands: CommandLog;
  nodes: NodeRequests;
  now: () => number;
}

/** A signal or a piece of stdin reaches a running command in milliseconds; this bounds a lost reply. */
const COMMAND_INPUT_TIMEOUT_MS = 15_000;
/** A signal or stdin for a command still queued waits this long for it to start. */
const QUEUED_INPUT_WAIT_MS = 5000;
const POLL_MS = 25;

/** Input for a running command (scope sandbox:exec): sent to its sandbox's host, which holds the command's channel to the init. */
export async function sendToRunningCommand(deps: CommandInputDeps, principal: Principal, id: string, input: CommandInput): Promise<CommandInputResult> {
  requireScope(principal, 'sandbox:exec');
  const { commandId } = input;
  const sandbox = await deps.registry.getOwned(id, principal.tenant);
  let record = await deps.commands.get(id, commandId);
  // Just sent (a background command signalled at once): its host takes it within moments.
  for (const until = deps.now() + QUEUED_INPUT_WAIT_MS; record?.state === 'queued' && deps.now() < until; record = await deps.commands.get(id, commandId)) await sleep(POLL_MS);
  if (!record) throw new RollboxError('not_found', `command ${commandId} not found in sandbox ${id}`);
  if (record.state !== 'running') throw new RollboxError('invalid_state', `command ${commandId} is ${record.state}, not running`);
  if (!sandbox.node) throw new RollboxError('invalid_state', `sandbox ${id} is ${sandbox.state}`);
  const reply = await deps.nodes.sendOp(sandbox.node, { ...input, sandboxId: id, requestId: newId('req') }, COMMAND_INPUT_TIMEOUT_MS);
  if (reply.kind === 'error') throw toRollboxError(reply.error);
  return { commandId, state: 'running' };
}

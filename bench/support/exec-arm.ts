/**
 * bench:e2b's command arm, run as its own process (client-process.ts), as a harness is; the
 * E2B SDK's client side (Connect, protobuf, fetch) costs more CPU than rollbox's own client,
 * so in the bench's process it would lengthen its own arm most. Interleaved one by one, in
 * the same sandbox:
 * - `commands.run('true')` through the official E2B SDK (its Connect stream to envd at the gateway);
 * - the floor: rollbox's own TypeScript client's `exec` of the same command;
 * - context: that client's streaming exec (SSE), the path an E2B command takes inside rollbox.
 * Progress on stderr; the samples as one JSON line on stdout.
 */
import { Sandbox } from 'e2b';
import { RollboxClient } from '../../src/client/index.ts';
import { runInClientProcess, serveClientProcess, timedInTurn } from './client-process.ts';

export interface ExecArmInput {
  runs: number;
  /** The gateway (E2B's API and sandbox URL too), an E2B key and a rollbox token of the same tenant. */
  gatewayUrl: string;
  e2bKey: string;
  token: string;
  sandboxId: string;
}

export interface ExecArmSamples {
  e2b: number[];
  floor: number[];
  nativeStream: number[];
}

/** Runs the arm in a process of its own; resolves with its samples. */
export function runExecArm(input: ExecArmInput): Promise<ExecArmSamples> {
  return runInClientProcess(import.meta.filename, 'the command arm', input);
}

async function main(input: ExecArmInput): Promise<ExecArmSamples> {
  Object.assign(process.env, { E2B_API_URL: input.gatewayUrl, E2B_SANDBOX_URL: input.gatewayUrl, E2B_API_KEY: input.e2bKey });
  const sbx = await Sandbox.connect(input.sandboxId);
  const native = new RollboxClient({ baseUrl: input.gatewayUrl, token: input.token });
  const viaSdk = async () => {
    const r = await sbx.commands.run('true');
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
  };
  const viaNative = async () => {
    const r = await native.exec(input.sandboxId, { cmd: 'true' });
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
  };
  const viaNativeStream = async () => {
    for await (const ev of native.streamExec(input.sandboxId, { cmd: 'true' })) if (ev.type === 'exit' && ev.result.exitCode !== 0) throw new Error(`exit ${ev.result.exitCode}`);
  };
  for (let i = 0; i < 20; i++) await Promise.all([viaSdk(), viaNative(), viaNativeStream()]);
  return timedInTurn("commands.run('true'), SDK then native", input.runs, { e2b: viaSdk, floor: viaNative, nativeStream: viaNativeStream });
}

await serveClientProcess(import.meta.filename, main);

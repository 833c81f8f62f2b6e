import { spawn } from 'node:child_process';
import { z } from 'zod';
import { RollboxError } from '../../api/index.ts';
import type { CloudProvider, ProviderHost, ProvisionRequest } from './types.ts';

export interface CommandProviderOptions {
  /** Executables (run through `sh -c`, so arguments may follow) for each action. */
  provision: string;
  terminate: string;
  list: string;
  timeoutMs: number;
}

const ProvisionOutput = z.object({ id: z.string().min(1).max(256) });
const ListOutput = z.object({ hosts: z.array(z.object({ id: z.string().min(1), state: z.string().default('running'), startedAtMs: z.number().default(0) })) });
const OUTPUT_CAP_BYTES = 1 << 20;

/**
 * Operator-supplied programs start and stop VMs, as Slurm's ResumeProgram and
 * SuspendProgram do. Each gets one JSON object on stdin and prints one JSON object on
 * stdout; a non-zero exit, a timeout or unparsable output is an error naming the action.
 *   provision: stdin {action, hostId, pool, gatewayUrl, token, redisUrl, layers, slots} -> {"id": "<vm id>"}
 *   terminate: stdin {action, id} -> anything (exit 0 = done; must be idempotent)
 *   list:      stdin {action} -> {"hosts": [{"id", "state", "startedAtMs"}]}
 */
export class CommandProvider implements CloudProvider {
  readonly name = 'command';
  constructor(private readonly options: CommandProviderOptions) {}

  async provision(request: ProvisionRequest): Promise<{ id: string }> {
    return parseOutput('provision', ProvisionOutput, await this.run('provision', this.options.provision, { action: 'provision', ...request }));
  }

  async terminate(id: string): Promise<void> {
    await this.run('terminate', this.options.terminate, { action: 'terminate', id });
  }

  async list(): Promise<ProviderHost[]> {
    return parseOutput('list', ListOutput, await this.run('list', this.options.list, { action: 'list' })).hosts;
  }

  private run(action: string, command: string, input: object): Promise<string> {
    return new Promise((resolve, reject) => {
      // Own process group, so a timeout kills the program and whatever it started.
      const child = spawn('sh', ['-c', command], { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
      let stdout = '';
      let stderr = '';
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        try {
          process.kill(-child.pid!, 'SIGKILL');
        } catch {
          /* already gone */
        }
      }, this.options.timeoutMs);
      child.stdout.on('data', (chunk: Buffer) => {
        if (stdout.length < OUTPUT_CAP_BYTES) stdout += chunk.toString('utf8');
      });
      child.stderr.on('data', (chunk: Buffer) => {
        if (stderr.length < 4096) stderr += chunk.toString('utf8');
      });
      child.stdin.on('error', () => {}); // a program that does not read stdin
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(new RollboxError('unavailable', `burst ${action} command could not start: ${err.message}`));
      });
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        if (timedOut) return reject(new RollboxError('timeout', `burst ${action} command did not finish within ${this.options.timeoutMs} ms`));
        if (code !== 0) return reject(new RollboxError('unavailable', `burst ${action} command failed (${signal ?? `exit ${code}`}): ${stderr.trim().slice(0, 500)}`));
        resolve(stdout);
      });
      child.stdin.end(JSON.stringify(input));
    });
  }
}

function parseOutput<T>(action: string, schema: z.ZodType<T>, stdout: string): T {
  let json: unknown;
  try {
    json = JSON.parse(stdout);
  } catch {
    throw new RollboxError('unavailable', `burst ${action} command printed no JSON: ${JSON.stringify(stdout.slice(0, 200))}`);
  }
  const parsed = schema.safeParse(json);
  if (!parsed.success) throw new RollboxError('unavailable', `burst ${action} command printed unexpected JSON: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
  return parsed.data;
}

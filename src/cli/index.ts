import { registerCommandCommands } from './command.ts';
import { Command, Option } from 'commander';
import type { Config } from '../config/index.ts';
import { registerBatchCommands } from './batch.ts';
import { registerRolloutCommands } from './rollout.ts';
import { addBurstRecordCommand } from './burst-record.ts';
import { registerBurstCommands } from './burst.ts';
import { registerE2bKeyCommands } from './e2b-key.ts';
import { registerImageCommands } from './image.ts';
import { registerSandboxCommands } from './sandbox.ts';

/**
 * The server roles (and config, IAM), imported only by the commands that use them: they pull
 * in the whole gateway and worker host, seconds of CPU for a client command such as
 * `rollbox batch submit` to load.
 */
const roles = () => import('../roles/index.ts');

/** Flags override the environment; the result is parsed once into a Config. */
async function configFrom(flags: { port?: string; dataDir?: string; nodeId?: string; pool?: string }): Promise<Config> {
  const { loadConfig } = await import('../config/index.ts');
  return loadConfig(process.env, { ROLLBOX_PORT: flags.port, ROLLBOX_DATA_DIR: flags.dataDir, ROLLBOX_NODE_ID: flags.nodeId, ROLLBOX_POOL: flags.pool });
}

function requireRedisUrl(config: Config): string {
  if (!config.redisUrl) throw new Error('REDIS_URL is required for this role (rollbox up starts its own Redis)');
  return config.redisUrl;
}

/** Runs until SIGINT/SIGTERM, then stops what it started, once. */
function stopOnSignal(stop: () => Promise<void>): void {
  let stopping = false;
  const onSignal = (signal: string) => {
    if (stopping) return;
    stopping = true;
    process.stderr.write(`\nrollbox: ${signal}, stopping...\n`);
    stop().then(
      () => process.exit(0),
      (err) => {
        process.stderr.write(`rollbox: stop failed: ${err instanceof Error ? err.message : String(err)}\n`);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', () => onSignal('SIGINT'));
  process.on('SIGTERM', () => onSignal('SIGTERM'));
}

export async function runCli(argv: string[]): Promise<void> {
  const program = new Command('rollbox').description('sandbox infrastructure for agentic RL').showHelpAfterError();
  const dataDir = new Option('--data-dir <dir>', 'data directory (env ROLLBOX_DATA_DIR)').default(undefined);
  const port = new Option('--port <port>', 'HTTP port (env ROLLBOX_PORT, default 8080)');

  program
    .command('up')
    .description('start redis-server, a worker host and a gateway on this machine')
    .addOption(port)
    .addOption(dataDir)
    .action(async (flags) => {
      const config = await configFrom(flags);
      const { createLogger, startEmbedded } = await roles();
      const logger = createLogger(config, 'rollbox');
      const stack = await startEmbedded(config, logger);
      stopOnSignal(stack.stop);
      const curl = `curl -s -X POST -H 'Authorization: Bearer ${stack.adminToken}' -H 'Content-Type: application/json' -d '{}' ${stack.url}/v1/sandboxes`;
      process.stdout.write(
        [
          '',
          `rollbox is up: gateway ${stack.url}, worker host ${stack.nodeId}, redis ${stack.redisUrl}`,
          `data dir: ${config.dataDir}`,
          '',
          `admin token (30 days):`,
          stack.adminToken,
          '',
          'create a sandbox:',
          `  ${curl}`,
          'then run a command in it (put its id in place of SBX):',
          `  curl -s -X POST -H 'Authorization: Bearer ${stack.adminToken}' -H 'Content-Type: application/json' -d '{"cmd":"echo hello from $(hostname)"}' ${stack.url}/v1/sandboxes/SBX/exec`,
          `bring your own environment: docker save IMAGE -o image.tar; rollbox image import image.tar --name NAME (with ROLLBOX_URL and ROLLBOX_TOKEN set),`,
          `  then create with '{"image":{"base":"NAME"}}'`,
          `API description: ${stack.url}/openapi.json`,
          `evaluation batches (rollbox batch submit tasks.jsonl --follow, with ROLLBOX_URL and ROLLBOX_TOKEN set) are shown at:`,
          `  ${stack.url}/ui#token=${stack.adminToken}`,
          'Ctrl-C stops everything.',
          '',
        ].join('\n'),
      );
    });

  program
    .command('gateway')
    .description('start one gateway against REDIS_URL')
    .addOption(port)
    .addOption(dataDir)
    .action(async (flags) => {
      const config = await configFrom(flags);
      const redisUrl = requireRedisUrl(config);
      const { createLogger, ensureBaseLayer, startGatewayRole } = await roles();
      const gateway = await startGatewayRole(config, redisUrl, createLogger(config, 'gateway'), { prepare: () => ensureBaseLayer(config, redisUrl).then(() => undefined) });
      stopOnSignal(gateway.stop);
    });

  program
    .command('worker')
    .description('start one worker host against REDIS_URL')
    .addOption(dataDir)
    .option('--node-id <id>', 'node id (default: generated once and kept in the data dir)')
    .option('--pool <pool>', 'pool name (env ROLLBOX_POOL, default local)')
    .option('--destroy-on-exit', 'stop its sandboxes on exit instead of leaving them for the next start to adopt')
    .action(async (flags) => {
      const config = await configFrom(flags);
      const { createLogger, startWorkerRole } = await roles();
      const worker = await startWorkerRole(config, requireRedisUrl(config), createLogger(config, 'worker'));
      stopOnSignal(() => worker.stop({ destroySandboxes: Boolean(flags.destroyOnExit) }));
    });

  const token = program.command('token').description('API tokens');
  token
    .command('issue')
    .description('print a signed token on stdout')
    .addOption(dataDir)
    .requiredOption('--tenant <tenant>', 'tenant id')
    .requiredOption('--scopes <scopes>', 'comma-separated scopes, e.g. sandbox:create,sandbox:exec')
    .option('--ttl <ttl>', 'lifetime: 30m, 1h, 7d', '1h')
    .action(async (flags) => {
      const config = await configFrom(flags);
      const { issueTokenCommand } = await import('../iam/index.ts');
      const value = await issueTokenCommand({ jwtConfig: config.jwt, tenant: flags.tenant, scopes: String(flags.scopes).split(','), ttl: flags.ttl });
      process.stdout.write(`${value}\n`);
    });

  registerBurstCommands(program);
  registerBatchCommands(program);
  registerRolloutCommands(program);
  registerImageCommands(program);
  registerSandboxCommands(program);
  registerCommandCommands(program);
  registerE2bKeyCommands(program, async () => (await configFrom({})).redisUrl);
  addBurstRecordCommand(program);

  try {
    await program.parseAsync(argv);
  } catch (err) {
    process.stderr.write(`rollbox: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  }
}

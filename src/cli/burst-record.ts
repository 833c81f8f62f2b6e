import type { Command } from 'commander';
import { parseTtl } from '../iam/ttl.ts'; // the function alone: the IAM module brings Redis stores

/** `--since`: a duration back from now (30m, 2h, 1d), an ISO date, or epoch ms. */
export function parseSince(value: string, nowMs: number): number {
  if (/^\d{13}$/.test(value)) return Number(value);
  if (/^\d+[smhd]$/.test(value)) return nowMs - parseTtl(value) * 1000;
  const date = Date.parse(value);
  if (Number.isNaN(date)) throw new Error(`--since ${JSON.stringify(value)}: expected a duration (30m, 2h, 1d), an ISO date or epoch ms`);
  return date;
}

/**
 * `rollbox burst record`: writes the creates the gateways recorded (Redis stream) as a
 * trace file that `rollbox burst simulate --trace` replays. Added to the `burst` command
 * group, which is created here if the simulator commands have not created it.
 */
export function addBurstRecordCommand(program: Command): void {
  const burst = program.commands.find((c) => c.name() === 'burst') ?? program.command('burst').description('cloud burst: traces, simulation, policy tuning');
  burst
    .command('record')
    .description('export the live create events (recorded by the gateways) as a replayable trace')
    .requiredOption('--out <file>', 'trace file to write (JSON lines)')
    .option('--since <when>', 'start: a duration back from now (30m, 2h, 1d), an ISO date, or epoch ms', '1d')
    .action(async (flags: { out: string; since: string }) => {
      // Imported here, not at the top: the server side costs every other command seconds of loading.
      const [{ exportTrace, writeTraceFile }, { loadConfig }, { connectRedis }, { LayerRegistry, SandboxRegistry }] = await Promise.all([
        import('../burst/trace/index.ts'),
        import('../config/index.ts'),
        import('../redis/index.ts'),
        import('../registry/index.ts'),
      ]);
      const config = loadConfig(process.env);
      if (!config.redisUrl) throw new Error('REDIS_URL is required: the recorded events live in the cluster Redis');
      const redis = connectRedis(config.redisUrl);
      try {
        const trace = await exportTrace({ redis, registry: new SandboxRegistry(redis), layers: new LayerRegistry(redis), now: Date.now }, parseSince(flags.since, Date.now()));
        writeTraceFile(flags.out, trace.header, trace.events);
        process.stderr.write(`wrote ${trace.events.length} events (${trace.imputedLifetimes} with the median lifetime: they never ran) to ${flags.out}\n`);
      } finally {
        await redis.quit().catch(() => {});
      }
    });
}

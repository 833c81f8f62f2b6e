import type { Command } from 'commander';
import type { E2bKeyStore } from '../iam/index.ts';

/** Runs `use` with a key store on REDIS_URL, then closes the connection. */
async function withKeys<T>(redisUrlOf: () => Promise<string | undefined>, use: (keys: E2bKeyStore) => Promise<T>): Promise<T> {
  const redisUrl = await redisUrlOf();
  if (!redisUrl) throw new Error('REDIS_URL is required: E2B keys live in the cluster\'s Redis (rollbox up prints its URL)');
  const [{ E2bKeyStore }, { connectRedis }] = await Promise.all([import('../iam/index.ts'), import('../redis/index.ts')]);
  const redis = connectRedis(redisUrl, { maxRetriesPerRequest: 1 });
  try {
    return await use(new E2bKeyStore(redis));
  } finally {
    redis.disconnect();
  }
}

/**
 * `rollbox e2b-key issue|list|revoke`: E2B API keys (what the E2B SDK sends as
 * E2B_API_KEY), each standing for a tenant and scopes. The key is printed once, at issue.
 */
export function registerE2bKeyCommands(program: Command, redisUrl: () => Promise<string | undefined>): void {
  const e2bKey = program.command('e2b-key').description('API keys for the E2B SDK (E2B_API_KEY)');
  e2bKey
    .command('issue')
    .description('print a new key on stdout (its id on stderr)')
    .requiredOption('--tenant <tenant>', 'tenant id')
    .option('--scopes <scopes>', 'comma-separated scopes', 'sandbox:create,sandbox:exec,sandbox:read,sandbox:delete,sandbox:snapshot,sandbox:policy')
    .option('--name <name>', 'a note to tell keys apart')
    .action(async (flags: { tenant: string; scopes: string; name?: string }) => {
      const { key, record } = await withKeys(redisUrl, (keys) => keys.issue({ tenant: flags.tenant, scopes: flags.scopes.split(','), name: flags.name }));
      process.stderr.write(`key id ${record.keyId} (tenant ${record.tenant}; revoke with: rollbox e2b-key revoke ${record.keyId})\n`);
      process.stdout.write(`${key}\n`);
    });
  e2bKey
    .command('list')
    .description('the keys issued (ids, tenants, scopes; never the keys)')
    .action(async () => {
      for (const r of await withKeys(redisUrl, (keys) => keys.list())) process.stdout.write(`${r.keyId}\t${r.tenant}\t${r.scopes.join(',')}\t${r.createdAt}\t${r.name ?? ''}\n`);
    });
  e2bKey
    .command('revoke <keyId>')
    .description('refuse the key from now on (every gateway within 5 s)')
    .action(async (keyId: string) => {
      if (!(await withKeys(redisUrl, (keys) => keys.revoke(keyId)))) throw new Error(`no E2B key with id ${keyId}`);
      process.stdout.write(`revoked ${keyId}\n`);
    });
}

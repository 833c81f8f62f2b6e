/**
 * A process of hollow worker hosts for bench:scale (started by it with an IPC channel):
 * HOLLOW_COUNT hosts on REDIS_URL, each promising HOLLOW_CAPACITY (JSON), node config from
 * the ROLLBOX_* variables. Says `{ready, nodeIds}` when every host has started; answers
 * `loads` with the sandboxes each host holds; `stop` stops them and exits.
 */
import pino from 'pino';
import { loadConfig } from '../../src/config/index.ts';
import { startHollowHosts } from '../../src/workers/hollow/index.ts';

const count = Number(process.env.HOLLOW_COUNT ?? 10);
const redisUrl = process.env.REDIS_URL;
if (!redisUrl || !process.send) throw new Error('hollow-hosts.ts runs as bench:scale\'s child (REDIS_URL and an IPC channel)');
const config = loadConfig(process.env);
const logger = pino({ level: process.env.ROLLBOX_LOG_LEVEL ?? 'warn' });
const hosts = await startHollowHosts({ count, redisUrl, config: config.node, capacity: JSON.parse(process.env.HOLLOW_CAPACITY ?? '{}'), logger, idPrefix: process.env.HOLLOW_ID_PREFIX ?? '' });
process.send({ kind: 'ready', nodeIds: hosts.nodeIds });
process.on('message', (message: { kind: string }) => {
  if (message.kind === 'loads') process.send!({ kind: 'loads', loads: Object.fromEntries(hosts.sandboxesByNode()) });
  if (message.kind === 'stop') void hosts.stop().finally(() => process.exit(0));
});
process.on('disconnect', () => void hosts.stop().finally(() => process.exit(0)));

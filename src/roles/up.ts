/** `rollbox up`: the whole stack in one process on an embedded default. */
import fs from 'node:fs/promises';
import path from 'node:path';
import { type Logger } from 'pino';
import type { Config } from '../config/index.ts';
import { createTokenIssuer, loadOrCreateHsSecret } from '../iam/index.ts';
import { startRedisServer, type RedisServerHandle } from '../redis/index.ts';
import { startGatewayRole } from './gateway.ts';
import { ensureBaseLayer, startWorkerRole } from './worker.ts';
import type { Stoppable } from './shared.ts';

export interface EmbeddedStack extends Stoppable {
  url: string;
  redisUrl: string;
  adminToken: string;
  nodeId: string;
}

/**
 * `rollbox up`: its own redis-server (unless REDIS_URL is set) with data under the data
 * dir, the busybox base layer, one worker host and one gateway.
 */
export async function startEmbedded(config: Config, logger: Logger): Promise<EmbeddedStack> {
  await fs.mkdir(config.dataDir, { recursive: true });
  let redisServer: RedisServerHandle | undefined;
  const stops: (() => Promise<void>)[] = [];
  const stopAll = async () => {
    for (const stop of stops.reverse()) await stop().catch((err) => logger.error({ err }, 'stop failed'));
    stops.length = 0;
  };
  try {
    if (!config.redisUrl) {
      redisServer = await startRedisServer({ dataDir: path.join(config.dataDir, 'redis') });
      stops.push(() => redisServer!.stop());
    }
    const redisUrl = config.redisUrl ?? redisServer!.url;
    if (config.jwt.alg === 'HS256') await loadOrCreateHsSecret(config.jwt.secretFile);
    await ensureBaseLayer(config, redisUrl);
    // Its agent sandboxes (network.gateway) reach the gateway this process starts next.
    const own: { gateway?: { host: string; port: number } } = {};
    const worker = await startWorkerRole(config, redisUrl, logger.child({ role: 'worker' }), { gatewayTargets: () => (own.gateway ? [own.gateway] : []) });
    stops.push(() => worker.stop({ destroySandboxes: true }));
    const gateway = await startGatewayRole(config, redisUrl, logger.child({ role: 'gateway' }));
    const listening = new URL(gateway.url);
    own.gateway = { host: listening.hostname, port: Number(listening.port) };
    stops.push(() => gateway.stop());
    const adminToken = await createTokenIssuer(config.jwt).issue({ tenant: 'admin', scopes: ['admin'], ttlSeconds: 30 * 24 * 3600 });
    return { url: gateway.url, redisUrl, adminToken, nodeId: worker.nodeId, stop: stopAll };
  } catch (err) {
    await stopAll();
    throw err;
  }
}

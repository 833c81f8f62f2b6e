import type { Config } from '../config/index.ts';
import { ModelGateway, type ModelGatewayDeps } from '../model-gateway/index.ts';
import { connectRedis } from '../redis/index.ts';

/**
 * Part of the composition root (roles/index.ts): the model gateway of hosted rollouts, started,
 * with a pub/sub connection of its own for the jobs' hold and binding events.
 */
export async function modelGatewayOf(config: Config, redisUrl: string, deps: Omit<ModelGatewayDeps, 'subscriber' | 'config'>): Promise<ModelGateway> {
  const model = new ModelGateway({ ...deps, subscriber: connectRedis(redisUrl), config: config.model });
  await model.start();
  return model;
}

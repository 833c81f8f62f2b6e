export { startRedisServer } from './server.ts';
export type { RedisServerHandle } from './server.ts';
export { connectRedis } from './connect.ts';

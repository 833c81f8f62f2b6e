export { startRedisServer } from './server.ts';
export type { RedisServerHandle } from './server.ts';
export { connectRedis } from './connect.ts';
export { BlockingPool } from './blocking-pool.ts';
export { LuaScript } from './lua.ts';
export { RedisRefusedError, redactedRedisUrl, waitForRedis } from './wait.ts';
export type { RedisWaitState } from './wait.ts';

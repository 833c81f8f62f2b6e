import type { Redis } from 'ioredis';

/**
 * Connections for blocking reads (XREAD BLOCK), which hold their connection while they
 * wait: lent one call at a time, so many followers share a few connections; idle ones
 * beyond `maxIdle` are closed.
 */
export class BlockingPool {
  private readonly idle: Redis[] = [];
  private readonly open = new Set<Redis>();
  private closed = false;

  constructor(
    private readonly connect: () => Redis,
    private readonly maxIdle = 16,
  ) {}

  async with<T>(fn: (connection: Redis) => Promise<T>): Promise<T> {
    if (this.closed) throw new Error('blocking pool closed');
    let connection = this.idle.pop();
    if (!connection) {
      connection = this.connect();
      this.open.add(connection);
    }
    try {
      return await fn(connection);
    } finally {
      if (!this.closed && this.idle.length < this.maxIdle) this.idle.push(connection);
      else {
        this.open.delete(connection);
        connection.disconnect();
      }
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    this.idle.length = 0;
    await Promise.all([...this.open].map((c) => c.quit().catch(() => c.disconnect())));
    this.open.clear();
  }
}

import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Redis } from 'ioredis';
import { RollboxError } from '../api/index.ts';
import { keys } from '../registry/index.ts';

/** How long a ticket opens a connection: it is used at once, this covers clock skew between hosts. */
const TICKET_TTL_MS = 60_000;
const TICKET = /^v1 (sbx_[a-z0-9]{1,40}) (\d{1,5}) (\d{13}) ([0-9a-f]{64})$/;

export interface PortTarget {
  sandboxId: string;
  port: number;
}

/**
 * What lets a gateway open one connection to a port of one sandbox through a worker host's
 * port relay: `v1 <sandbox id> <port> <expiry ms> <hmac>`, an HMAC under a secret that
 * gateways and worker hosts share through Redis (made once, by whichever asks first), so
 * neither checking nor minting costs a Redis call. Nothing but a gateway, after its own
 * tenant check, mints one; a sandbox never sees the secret (Redis is blocked to it).
 */
export class PortTickets {
  private secret: Buffer | undefined;

  constructor(
    private readonly redis: Pick<Redis, 'set' | 'get'>,
    private readonly now: () => number = Date.now,
  ) {}

  private async key(): Promise<Buffer> {
    if (this.secret) return this.secret;
    await this.redis.set(keys.portRelaySecret, randomBytes(32).toString('hex'), 'NX');
    this.secret = Buffer.from((await this.redis.get(keys.portRelaySecret))!, 'hex');
    return this.secret;
  }

  private async mac(sandboxId: string, port: number, expiresAtMs: number): Promise<string> {
    return createHmac('sha256', await this.key()).update(`port:${sandboxId}:${port}:${expiresAtMs}`).digest('hex');
  }

  async mint({ sandboxId, port }: PortTarget): Promise<string> {
    const expiresAtMs = this.now() + TICKET_TTL_MS;
    return `v1 ${sandboxId} ${port} ${expiresAtMs} ${await this.mac(sandboxId, port, expiresAtMs)}`;
  }

  /** The target a ticket opens, else `unauthenticated` (malformed, forged or expired). */
  async verify(ticket: string): Promise<PortTarget> {
    const m = TICKET.exec(ticket);
    if (!m) throw new RollboxError('unauthenticated', 'malformed port relay ticket');
    const [, sandboxId, portText, expiryText, mac] = m as unknown as [string, string, string, string, string];
    const port = Number(portText);
    const expiresAtMs = Number(expiryText);
    const expected = Buffer.from(await this.mac(sandboxId, port, expiresAtMs));
    if (!timingSafeEqual(Buffer.from(mac), expected)) throw new RollboxError('unauthenticated', 'port relay ticket does not verify');
    if (expiresAtMs < this.now()) throw new RollboxError('unauthenticated', 'port relay ticket expired');
    return { sandboxId, port };
  }
}

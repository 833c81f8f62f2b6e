import { RollboxError, SCOPES, type Scope } from '../api/index.ts';

/** Tenant ids go into Redis keys, paths and labels, so the alphabet is kept small. */
export const TENANT_PATTERN = /^[A-Za-z0-9_.-]{1,64}$/;

/** The rollout a principal acts for, when it authenticated with a rollout key. */
export interface RolloutGrant {
  readonly id: string;
  readonly job: string;
}

/** Who is calling. Cached and shared between requests, hence read-only. */
export interface Principal {
  readonly tenant: string;
  readonly scopes: ReadonlySet<Scope>;
  readonly subject?: string;
  readonly tokenId?: string;
  /** Set when the caller is a hosted rollout's agent (a rollout key): confined to that rollout's sandboxes and model calls. */
  readonly rollout?: RolloutGrant;
}

const KNOWN_SCOPES: ReadonlySet<string> = new Set(SCOPES);

export function isScope(value: unknown): value is Scope {
  return typeof value === 'string' && KNOWN_SCOPES.has(value);
}

export function isValidTenant(value: unknown): value is string {
  return typeof value === 'string' && TENANT_PATTERN.test(value);
}

/**
 * The `scopes` claim as a set of known scopes. Accepts an array of strings or one
 * space-separated string (the OAuth `scope` style). Unknown scopes are dropped rather than
 * failing the token, so an issuer can hand out scopes a newer rollbox understands.
 * Returns undefined when the claim has the wrong type.
 */
export function scopesFromClaim(claim: unknown): Set<Scope> | undefined {
  let items: unknown[];
  if (claim === undefined) items = [];
  else if (typeof claim === 'string') items = claim.split(/\s+/);
  else if (Array.isArray(claim)) items = claim;
  else return undefined;
  const scopes = new Set<Scope>();
  for (const item of items) if (isScope(item)) scopes.add(item);
  return scopes;
}

/** Throws `forbidden` unless the principal holds one of the scopes, or `admin`. */
export function requireScope(principal: Principal, ...anyOf: [Scope, ...Scope[]]): void {
  if (principal.scopes.has('admin') || anyOf.some((scope) => principal.scopes.has(scope))) return;
  throw new RollboxError('forbidden', `missing scope ${anyOf.join(' or ')}`);
}

/**
 * Whose layers and images the principal reads (src/registry/owners.ts): its tenant's own and
 * the published ones; admin tokens and worker hosts' `layer:host` tokens (their lazy fetches
 * read whatever their sandboxes mount) every one.
 */
export function readerOf(principal: Principal): { tenant: string; all: boolean } {
  return { tenant: principal.tenant, all: principal.scopes.has('admin') || principal.scopes.has('layer:host') };
}

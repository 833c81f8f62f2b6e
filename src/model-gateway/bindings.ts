import type { Redis } from 'ioredis';
import { ModelBinding, type ModelBindingParsed, type ModelBindingView } from '../api/index.ts';
import { jobRef, modelKeys } from './keys.ts';

/** A job's binding as kept. */
export type StoredBinding = ModelBindingParsed & { updatedAt: string };

/** A gateway trusts its copy of a binding this long (a change also reaches it at once through the job's events). */
const CACHE_MS = 1000;

/**
 * Where each job's model calls go: its upstreams and the headers (the trainer's
 * credentials) added to every request, registered by the trainer. Header values are
 * never shown back, never recorded, never relayed to an agent.
 */
export class ModelBindings {
  private readonly cache = new Map<string, { binding: StoredBinding | null; atMs: number }>();

  constructor(
    private readonly redis: Redis,
    private readonly now: () => number = Date.now,
  ) {}

  async put(tenant: string, job: string, input: ModelBinding): Promise<StoredBinding> {
    const stored: StoredBinding = { ...ModelBinding.parse(input), updatedAt: new Date(this.now()).toISOString() };
    await this.redis.set(modelKeys.binding(tenant, job), JSON.stringify(stored));
    this.cache.set(jobRef(tenant, job), { binding: stored, atMs: this.now() });
    await this.redis.publish(modelKeys.events, `binding ${jobRef(tenant, job)}`);
    return stored;
  }

  async get(tenant: string, job: string): Promise<StoredBinding | null> {
    const ref = jobRef(tenant, job);
    const hit = this.cache.get(ref);
    if (hit && this.now() - hit.atMs < CACHE_MS) return hit.binding;
    const raw = await this.redis.get(modelKeys.binding(tenant, job));
    const binding = raw ? (JSON.parse(raw) as StoredBinding) : null;
    if (this.cache.size > 10_000) this.cache.clear();
    this.cache.set(ref, { binding, atMs: this.now() });
    return binding;
  }

  async delete(tenant: string, job: string): Promise<boolean> {
    const removed = await this.redis.del(modelKeys.binding(tenant, job));
    this.cache.delete(jobRef(tenant, job));
    await this.redis.publish(modelKeys.events, `binding ${jobRef(tenant, job)}`);
    return removed > 0;
  }

  /** This gateway's copy, if it has one (no Redis call). */
  peek(tenant: string, job: string): StoredBinding | null | undefined {
    return this.cache.get(jobRef(tenant, job))?.binding;
  }

  /** Drops this gateway's copy (the job's events said it changed). */
  invalidate(ref: string): void {
    this.cache.delete(ref);
  }
}

/** A binding as `GET /v1/jobs/:job/model` shows it: header names, never their values. */
export function bindingView(binding: StoredBinding | null): ModelBindingView['binding'] {
  if (!binding) return null;
  return {
    upstreams: binding.upstreams.map((u) => ({ baseUrl: u.baseUrl, headers: Object.keys(u.headers ?? {}), weight: u.weight })),
    headers: Object.keys(binding.headers),
    tokenFields: binding.tokenFields,
    ...(binding.models ? { models: binding.models } : {}),
    updatedAt: binding.updatedAt,
  };
}

/** Every header value of a binding (what must never appear in an answer or a record). */
export function secretsOf(binding: StoredBinding | null): string[] {
  if (!binding) return [];
  const values = [...Object.values(binding.headers), ...binding.upstreams.flatMap((u) => Object.values(u.headers ?? {}))];
  const secrets = new Set<string>();
  for (const value of values) {
    if (value.length >= 6) secrets.add(value);
    // `Bearer <key>`: the key alone must not show either.
    const token = /^\S+\s+(\S{6,})$/.exec(value)?.[1];
    if (token) secrets.add(token);
  }
  return [...secrets].sort((a, b) => b.length - a.length);
}

/** `text` with every secret replaced. */
export function scrub(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const secret of secrets) if (out.includes(secret)) out = out.split(secret).join('[redacted]');
  return out;
}

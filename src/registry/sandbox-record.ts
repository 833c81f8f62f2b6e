import { CreateSandboxRequest, Lineage, type FailureReason, type Sandbox, type SandboxState } from '../api/index.ts';

/** A sandbox record as the fields of its Redis hash, and back. */
export function toFields(record: Sandbox): string[] {
  const fields: Record<string, string | undefined> = {
    id: record.id,
    tenant: record.tenant,
    state: record.state,
    failureReason: record.failureReason,
    detail: record.detail,
    node: record.node,
    spec: JSON.stringify(record.spec),
    layerDigests: JSON.stringify(record.layerDigests),
    hibernationLayer: record.hibernationLayer,
    hibernatedWhole: record.hibernatedWhole ? '1' : undefined,
    swapped: record.swapped && JSON.stringify(record.swapped),
    createdAt: record.createdAt,
    startedAt: record.startedAt,
    endedAt: record.endedAt,
    expiresAt: record.expiresAt,
    oomKills: String(record.oomKills),
    pool: record.pool,
    lineage: record.lineage && JSON.stringify(record.lineage),
  };
  return Object.entries(fields).flatMap(([k, v]) => (v === undefined ? [] : [k, v]));
}

export function fromHash(hash: Record<string, string>): Sandbox | undefined {
  if (!hash.id) return undefined;
  return {
    id: hash.id,
    tenant: hash.tenant!,
    state: hash.state as SandboxState,
    failureReason: hash.failureReason as FailureReason | undefined,
    detail: hash.detail,
    node: hash.node,
    spec: specOf(hash.spec!),
    layerDigests: JSON.parse(hash.layerDigests ?? '[]') as string[],
    hibernationLayer: hash.hibernationLayer || undefined,
    ...(hash.hibernatedWhole === '1' ? { hibernatedWhole: true } : {}),
    ...(hash.swapped ? { swapped: JSON.parse(hash.swapped) as NonNullable<Sandbox['swapped']> } : {}),
    createdAt: hash.createdAt!,
    startedAt: hash.startedAt,
    endedAt: hash.endedAt,
    expiresAt: hash.expiresAt,
    oomKills: Number(hash.oomKills ?? 0),
    ...(hash.pool ? { pool: hash.pool } : {}),
    ...(hash.lineage ? { lineage: Lineage.parse(JSON.parse(hash.lineage)) } : {}),
  };
}

/**
 * A record's spec. One written under looser rules (an image config's env, workdir or user
 * before they were checked: a NUL, an oversized env) is read without those fields, so the
 * sandbox can still be read, listed, paused and deleted instead of failing every reader.
 */
function specOf(json: string): CreateSandboxRequest {
  const raw = JSON.parse(json) as Record<string, unknown>;
  const parsed = CreateSandboxRequest.safeParse(raw);
  if (parsed.success) return parsed.data;
  const { env: _env, workdir: _workdir, user: _user, ...rest } = raw;
  return CreateSandboxRequest.parse(rest);
}

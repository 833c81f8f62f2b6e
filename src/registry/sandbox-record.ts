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
    spec: CreateSandboxRequest.parse(JSON.parse(hash.spec!)),
    layerDigests: JSON.parse(hash.layerDigests ?? '[]') as string[],
    hibernationLayer: hash.hibernationLayer || undefined,
    ...(hash.hibernatedWhole === '1' ? { hibernatedWhole: true } : {}),
    createdAt: hash.createdAt!,
    startedAt: hash.startedAt,
    endedAt: hash.endedAt,
    expiresAt: hash.expiresAt,
    oomKills: Number(hash.oomKills ?? 0),
    ...(hash.pool ? { pool: hash.pool } : {}),
    ...(hash.lineage ? { lineage: Lineage.parse(JSON.parse(hash.lineage)) } : {}),
  };
}

/**
 * Who owns layers and images, and who reads them (issue 38). Every layer and image record
 * has owners: the tenants that stored it (a layer is content-addressed, so each tenant that
 * stored the same bytes owns them) or `CLUSTER_OWNER`, what an operator published
 * cluster-wide on purpose (the busybox base layer, the E2B `base` template, and whatever an
 * admin publishes). Records stored before owners existed have none: only `all` readers
 * (admin and worker hosts) see them.
 */

/** The owner of what is published cluster-wide; no tenant id has a `*` (TENANT_PATTERN). */
export const CLUSTER_OWNER = '*';

/** Whose layers and images a caller sees: its tenant's and the cluster's, or with `all` every one (admin tokens, worker hosts' `layer:host` tokens). */
export interface Reader {
  readonly tenant: string;
  readonly all: boolean;
}

/** The operator's view (config naming images and layers, the gateway's own builds): cluster names first, and every record. */
export const OPERATOR: Reader = { tenant: CLUSTER_OWNER, all: true };

/** The field under which an owner's name is kept (`<owner>/<name>`). */
export const ownedKey = (owner: string, name: string): string => `${owner}/${name}`;

/**
 * The fields a reader's `name` may be found under, in order: its own, the cluster's, and
 * for `all` readers the owner-less name of older data.
 */
export function lookupKeys(reader: Reader, name: string): string[] {
  const own = ownedKey(reader.tenant, name);
  const cluster = ownedKey(CLUSTER_OWNER, name);
  return [...new Set([own, cluster, ...(reader.all ? [name] : [])])];
}

/** The fields a reader may remove `name` under: its own, and for `all` readers the cluster's and the owner-less one. */
export function removableKeys(reader: Reader, name: string): string[] {
  return [...new Set([ownedKey(reader.tenant, name), ...(reader.all ? [ownedKey(CLUSTER_OWNER, name), name] : [])])];
}

/** The owner and name a stored field stands for (no owner: older data). */
export function splitKey(key: string): { owner?: string; name: string } {
  const slash = key.indexOf('/');
  return slash < 0 ? { name: key } : { owner: key.slice(0, slash), name: key.slice(slash + 1) };
}

/** How a reader ranks an owner's record of a name: 0 its own, 1 the cluster's, 2 any other for `all` readers; -1 not seen. */
export function rankOf(reader: Reader, owner: string | undefined): number {
  return owner === reader.tenant ? 0 : owner === CLUSTER_OWNER ? 1 : reader.all ? 2 : -1;
}

/** Whether a reader sees what these owners hold. */
export function sees(reader: Reader, owners: readonly string[]): boolean {
  return reader.all || owners.includes(reader.tenant) || owners.includes(CLUSTER_OWNER);
}

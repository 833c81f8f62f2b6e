/** JWT algorithms rollbox accepts; one is pinned per deployment. */
export type JwtAlg = 'HS256' | 'EdDSA' | 'ES256';

/** The `jwt` slice of the parsed config (`src/config`), restated so iam does not depend on env parsing. */
export interface JwtConfig {
  alg: JwtAlg;
  /** HS256 secret; created on first use (embedded default). */
  secretFile: string;
  /** PEM SPKI public key (EdDSA/ES256). Exactly one of this or `jwksUrl` for asymmetric algs. */
  publicKeyFile?: string | undefined;
  jwksUrl?: string | undefined;
  issuer: string;
  audience: string;
  clockToleranceSec: number;
}

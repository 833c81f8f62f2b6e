export type { JwtAlg, JwtConfig } from './config.ts';
export { TENANT_PATTERN, isScope, isValidTenant, requireScope, scopesFromClaim } from './principal.ts';
export type { Principal } from './principal.ts';
export { createTokenVerifier } from './verifier.ts';
export type { JwtTokenVerifier, TokenVerifier, TokenVerifierDeps } from './verifier.ts';
export { createTokenIssuer, issueTokenCommand } from './issuer.ts';
export type { IssueTokenCommandInput, IssueTokenRequest, TokenIssuer, TokenIssuerConfig, TokenIssuerDeps } from './issuer.ts';
export { loadOrCreateHsSecret } from './secret.ts';
export { parseTtl } from './ttl.ts';

export { RegistryRepository } from './client.ts';
export type { FetchedManifest, RegistryOptions } from './client.ts';
export { parseChallenges } from './challenge.ts';
export type { Challenge } from './challenge.ts';
export { loadDockerConfig, parseDockerConfig, registryHostOf } from './credentials.ts';
export type { Credentials } from './credentials.ts';
export { MEDIA_TYPES, INDEX_MEDIA_TYPES, MANIFEST_MEDIA_TYPES } from './media-types.ts';
export { ReferenceError, familiarName, parseReference } from './reference.ts';
export type { ImageReference } from './reference.ts';

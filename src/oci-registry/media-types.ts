/** Manifest and index media types a pull accepts (OCI and Docker schema 2), in the order sent in `Accept`. */
export const MEDIA_TYPES = {
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  dockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
} as const;

export const MANIFEST_ACCEPT = Object.values(MEDIA_TYPES).join(', ');

export const INDEX_MEDIA_TYPES: ReadonlySet<string> = new Set([MEDIA_TYPES.ociIndex, MEDIA_TYPES.dockerList]);
export const MANIFEST_MEDIA_TYPES: ReadonlySet<string> = new Set([MEDIA_TYPES.ociManifest, MEDIA_TYPES.dockerManifest]);

/** Docker schema 1 (signed JSON): no config blob, no diff_ids; refused. */
export const SCHEMA1_MEDIA_TYPES: ReadonlySet<string> = new Set(['application/vnd.docker.distribution.manifest.v1+json', 'application/vnd.docker.distribution.manifest.v1+prettyjws']);

/**
 * Image references as Docker reads them (`name[:tag][@digest]`): the first path component
 * is a registry when it has a `.` or a `:` or is `localhost`; otherwise the image is on
 * Docker Hub (`docker.io`, with `library/` before a one-component name); no tag and no
 * digest means the tag `latest`. Only sha256 digests are taken (as in import).
 */

export interface ImageReference {
  /** As refs and Docker's config.json name it: `docker.io`, `ghcr.io`, `127.0.0.1:5000`. */
  registry: string;
  /** The repository path on that registry: `library/python`, `myorg/task`. */
  repository: string;
  tag?: string;
  digest?: string;
  /** What the manifest is fetched by: the digest when given (the tag is then informative), else the tag. */
  reference: string;
  /** `docker.io/library/python:3.12`, `127.0.0.1:5000/t/task:1@sha256:...`. */
  canonical: string;
}

const DOCKER_HUB = 'docker.io';
const PATH_COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const DOMAIN = /^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?$/;
const TAG = /^[\w][\w.-]{0,127}$/;
const DIGEST = /^sha256:[0-9a-f]{64}$/;
/** Docker's limit on a repository's full name (registry included). */
const NAME_MAX = 255;

/** A reference that is not one, with Docker's reason. */
export class ReferenceError extends Error {
  override readonly name = 'ReferenceError';
}

export function parseReference(input: string): ImageReference {
  const fail = (why: string): never => {
    throw new ReferenceError(`${JSON.stringify(input.slice(0, 300))} is not an image reference: ${why}`);
  };
  if (input.length === 0) fail('empty');
  let rest = input;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) fail('the digest must be sha256:<64 hex digits>');
  }
  let tag: string | undefined;
  const colon = rest.lastIndexOf(':');
  if (colon > rest.lastIndexOf('/')) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) fail('a tag is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}');
  }
  const slash = rest.indexOf('/');
  const first = slash >= 0 ? rest.slice(0, slash) : '';
  const hasRegistry = slash >= 0 && (first.includes('.') || first.includes(':') || first === 'localhost' || first !== first.toLowerCase());
  let registry = hasRegistry ? first : DOCKER_HUB;
  let repository = hasRegistry ? rest.slice(slash + 1) : rest;
  if (hasRegistry && !DOMAIN.test(registry)) fail(`${registry} is not a registry host[:port]`);
  const port = /:(\d+)$/.exec(registry)?.[1];
  if (port !== undefined && !(Number(port) >= 1 && Number(port) <= 65_535)) fail(`port ${port.slice(0, 10)} is outside 1-65535`);
  // Host names are case-blind: the lowercase form is what config and auth files are matched against.
  registry = registry.toLowerCase();
  if (registry === 'index.docker.io' || registry === 'registry-1.docker.io') registry = DOCKER_HUB;
  if (repository !== repository.toLowerCase()) fail('a repository name must be lowercase');
  if (repository.split('/').some((c) => !PATH_COMPONENT.test(c))) fail('each path component is [a-z0-9] words joined by ".", "_", "__" or "-"');
  if (registry === DOCKER_HUB && !repository.includes('/')) repository = `library/${repository}`;
  if (`${registry}/${repository}`.length > NAME_MAX) fail(`the name is longer than ${NAME_MAX} characters`);
  if (!tag && !digest) tag = 'latest';
  const canonical = `${registry}/${repository}${tag ? `:${tag}` : ''}${digest ? `@${digest}` : ''}`;
  return { registry, repository, ...(tag ? { tag } : {}), ...(digest ? { digest } : {}), reference: digest ?? tag!, canonical };
}

/** As Docker shows it: `python:3.12` for `docker.io/library/python:3.12`, `myorg/task:1` for `docker.io/myorg/task:1`. */
export function familiarName(ref: ImageReference): string {
  const name = ref.registry === DOCKER_HUB ? ref.repository.replace(/^library\//, '') : `${ref.registry}/${ref.repository}`;
  return `${name}${ref.tag ? `:${ref.tag}` : ''}${ref.digest ? `@${ref.digest}` : ''}`;
}

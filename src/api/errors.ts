/**
 * The one table of error codes: each code's HTTP status and meaning. Handlers throw
 * `RollboxError` with a code; only the gateway's error handler turns a code into an HTTP
 * status (see `httpStatusOf`); docs/errors.md is generated from this table.
 */
export const ERROR_CODES = {
  invalid_request: { status: 400, meaning: 'The request does not match its schema or asks for something impossible (the message names the field).' },
  invalid_layer: { status: 400, meaning: 'An uploaded, imported or pulled layer is not a tar, its gzip or zstd stream is corrupt or cut, or it holds an entry no layer may hold (absolute or `..` names, links out, device nodes).' },
  invalid_image: { status: 400, meaning: 'An image archive is not a `docker save` or OCI layout tar, lacks a blob its manifest names, fails a digest check, has no manifest for the platform asked, has more layers than a sandbox can stack, or has a manifest, index or config field a create would refuse or no record may hold (the message names the field: an Env entry, WorkingDir, User, a platform, a layer size).' },
  invalid_archive: { status: 400, meaning: 'A tar for the files API names paths outside its directory, or is malformed.' },
  unauthenticated: { status: 401, meaning: 'No token, or one that does not verify (signature, `iss`, `aud`, `exp`).' },
  forbidden: { status: 403, meaning: 'The token lacks the scope the route needs, or a request into a sandbox\'s port by its E2B host name lacks the sandbox\'s traffic access token (`e2b-traffic-access-token`).' },
  not_found: { status: 404, meaning: 'No such sandbox, command, layer or route; another tenant\'s sandbox is not found either.' },
  conflict: { status: 409, meaning: 'The same Idempotency-Key with another body, or a state change that lost a race.' },
  invalid_state: { status: 409, meaning: 'Not in this state: exec in a paused sandbox, files in a hibernated one, resume of a running one...' },
  result_unknown: { status: 409, meaning: 'A command\'s worker host, or its sandbox\'s init, died while it ran: it may or may not have taken effect, and is never run again under its commandId.' },
  payload_too_large: { status: 413, meaning: 'A body, file or layer past its configured cap.' },
  range_not_satisfiable: { status: 416, meaning: 'A `Range` starts past the end of the layer file asked for (Content-Range says its size).' },
  quota_exceeded: { status: 429, meaning: 'The tenant\'s live-sandbox quota is used up (Retry-After).' },
  internal: { status: 500, meaning: 'A failure of rollbox itself (the message says which); retrying with the same Idempotency-Key or commandId is safe.' },
  admission_exhausted: { status: 503, meaning: 'Every worker host that could take the create refused it (Retry-After).' },
  no_capacity: { status: 503, meaning: 'No worker host has room for the request now (Retry-After).' },
  network_unavailable: { status: 503, meaning: 'The request needs an allowlist network and no worker host that could take it passes its network self-test, or it is an agent sandbox (`network.gateway`) and no such host\'s probe finds a gateway answering; the message names each host\'s cause (Retry-After).' },
  unavailable: { status: 503, meaning: 'A dependency (Redis, a gateway shutting down) is not available (Retry-After).' },
  timeout: { status: 504, meaning: 'The operation did not finish in time; the command log or the sandbox record says what became of it.' },
  node_lost: { status: 502, meaning: 'The worker host stopped heartbeating while the request was on it.' },
  image_not_found: { status: 404, meaning: 'An image pull found no such repository, tag or digest in the registry (or a mirror).' },
  registry_unauthorized: { status: 502, meaning: 'The registry refused rollbox\'s credentials for an image pull (none configured for it, or wrong ones: see `ROLLBOX_REGISTRY_AUTH_FILE`).' },
  registry_unavailable: { status: 502, meaning: 'An image pull could not reach the registry or it stopped answering: connection refused or cut, TLS failure (a plain-HTTP registry not listed in `ROLLBOX_REGISTRY_INSECURE`), a timeout, a body sent slower than `ROLLBOX_IMAGE_PULL_MIN_BYTES_PER_S`, an answer past its cap (a token answer), too many redirects, a 5xx or 429 answer.' },
  snapshot_failed: { status: 502, meaning: 'A microVM\'s snapshot stream from its guest was refused (not a tar of its writable layer, an entry no layer may hold, cut short, or silent past `ROLLBOX_VM_SNAPSHOT_IDLE_MS`), or the guest could not pack its writable layer (a name that is not UTF-8); the message says which. Nothing was stored, and the sandbox runs on.' },
  tier_unsupported: { status: 501, meaning: 'The sandbox\'s tier cannot do this (yet), or no worker host runs that tier: the message names the tier and the feature (docs/microvm.md).' },
  model_hold_expired: { status: 504, meaning: 'A model call was held (its job paused, its upstreams unreachable or unregistered) past `ROLLBOX_MODEL_MAX_HOLD_MS` or its rollout\'s wall time; answered in the SDK\'s error shape and recorded.' },
  model_limit_exceeded: { status: 403, meaning: 'The rollout used up its model calls or tokens (`maxModelCalls`, `maxTokens`): the call was not made.' },
  model_upstream_failed: { status: 502, meaning: 'A model call\'s answer was cut short more often than `ROLLBOX_MODEL_MAX_REISSUES` re-issues could mend, or its re-issue did not repeat what the agent had already received (an upstream that samples differently): recorded with its attempts.' },
  swap_unavailable: { status: 503, meaning: 'A swap pause found no room for the sandbox\'s memory on its worker host: no swap space configured there (`ROLLBOX_SWAP_FILE_MIB` 0), the swap file could not be enabled, or it is too full. The sandbox stays as it was (running, or frozen whole); pause it with `freeze` or `hibernate`, or retry later.' },
  template_not_ready: { status: 503, meaning: 'The E2B `base` template is still being built on this cluster (its first use); the message says how far the build is (Retry-After).' },
  not_implemented: { status: 501, meaning: 'An E2B route or option rollbox does not serve; the message names how rollbox differs (docs/e2b.md).' },
  image_pull_timeout: { status: 504, meaning: 'A create whose `image.ref` had to be pulled waited longer than `ROLLBOX_IMAGE_PULL_WAIT_MS` (the pull goes on: `GET /v1/images/:name`), or a pull ran past its own deadline, `ROLLBOX_IMAGE_PULL_DEADLINE_MS` (it ended `failed`, nothing of it stored).' },
  registry_not_allowed: { status: 403, meaning: 'The gateway\'s egress policy refused an image pull\'s destination: a registry not in `ROLLBOX_REGISTRY_ALLOW`, or a registry, redirect or token realm that is not http(s), names port 0, or reaches a loopback, link-local or private address without being listed in `ROLLBOX_REGISTRY_INTERNAL` (docs/images.md).' },
  invalid_dockerfile: { status: 400, meaning: 'An image build\'s Dockerfile (or steps) does not parse: an unknown instruction, one without arguments, a bad flag value, quote or substitution, an instruction before FROM, a COPY source not in the context; the message names the line.' },
  build_unsupported: { status: 400, meaning: 'An image build asks for what the builder cannot honour (RUN --mount, HEALTHCHECK, ONBUILD, VOLUME, STOPSIGNAL, heredocs, ADD from a URL or of an archive, COPY --link): refused at the request, naming the line, never skipped.' },
  port_closed: { status: 502, meaning: 'Nothing listens on the sandbox\'s port that a request through the port proxy (`/v1/sandboxes/:id/ports/:port/...`, an E2B `getHost` name) asked for: the connection was refused inside the sandbox.' },
  build_step_failed: { status: 422, meaning: 'An image build\'s RUN step exited non-zero or ran past the build\'s `stepTimeoutMs`: the build ended `failed` with the step\'s line, exit code and output; nothing of it was stored as the image.' },
} as const satisfies Record<string, { status: number; meaning: string }>;

export type ErrorCode = keyof typeof ERROR_CODES;

export class RollboxError extends Error {
  override readonly name = 'RollboxError';
  constructor(
    readonly code: ErrorCode,
    message: string,
    /** Seconds a client should wait before retrying (sent as Retry-After). */
    readonly retryAfterSeconds?: number,
  ) {
    super(message);
  }
}

export function httpStatusOf(code: ErrorCode): number {
  return ERROR_CODES[code].status;
}

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && Object.hasOwn(ERROR_CODES, value);
}

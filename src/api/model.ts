import { z } from 'zod';

/**
 * The model gateway's payloads (docs/model-gateway.md): a job's model binding (its
 * upstreams, as the trainer registers them), the record of one model call, the hold state
 * of a job's calls, a rollout's limits, and the per-job figures.
 */

/** The model APIs the gateway relays and records. */
export const MODEL_APIS = ['chat.completions', 'completions', 'responses', 'messages'] as const;
export const ModelApi = z.enum(MODEL_APIS);
export type ModelApi = z.infer<typeof ModelApi>;

/** Header names the gateway sets itself: a binding may not add them. */
const RESERVED_HEADERS = new Set(['host', 'content-length', 'content-type', 'connection', 'transfer-encoding', 'accept', 'accept-encoding', 'keep-alive', 'upgrade', 'te', 'trailer']);
const HeaderName = z
  .string()
  .regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$/, 'a header name (token characters)')
  .refine((name) => !RESERVED_HEADERS.has(name.toLowerCase()), 'a header the gateway sets itself');
const HeaderValue = z.string().max(8192).regex(/^[^\r\n\0]*$/, 'no CR, LF or NUL');
/** Headers to add upstream (the trainer's credentials): never shown back, never recorded, never sent to an agent. */
export const ModelHeaders = z.record(HeaderName, HeaderValue).refine((h) => Object.keys(h).length <= 32, 'at most 32 headers');

/** An upstream's base URL as an OpenAI client takes it (`http://vllm:8000/v1`): the gateway appends `/chat/completions`, `/messages`, ... */
export const ModelBaseUrl = z
  .string()
  .max(2048)
  .refine((value) => {
    if (!URL.canParse(value)) return false;
    const url = new URL(value);
    return (url.protocol === 'http:' || url.protocol === 'https:') && !url.username && !url.password && !url.search && !url.hash;
  }, 'an http(s) URL without credentials, query or fragment (credentials go in headers)');

export const ModelUpstream = z.object({
  baseUrl: ModelBaseUrl,
  /** Headers for this upstream only, over the binding's. */
  headers: ModelHeaders.optional(),
  /** Relative share of calls (spread by least in flight, weighted). */
  weight: z.number().int().min(1).max(100).default(1),
});
export type ModelUpstream = z.infer<typeof ModelUpstream>;

/** Token fields the trainer wants on every call it can have them for (chat and completions, vLLM's names). */
export const ModelTokenFields = z.object({
  /** vLLM `return_token_ids`: `prompt_token_ids` and each choice's `token_ids`. */
  returnTokenIds: z.boolean().default(false),
  /** `logprobs` of the sampled tokens. */
  logprobs: z.boolean().default(false),
  /** `top_logprobs` (chat) or `logprobs: n` (completions), when `logprobs`. */
  topLogprobs: z.number().int().min(0).max(20).default(0),
});
export type ModelTokenFields = z.infer<typeof ModelTokenFields>;

/** `PUT /v1/jobs/:job/model`: where the job's model calls go. */
export const ModelBinding = z.object({
  upstreams: z.array(ModelUpstream).min(1).max(64),
  /** Headers added to every upstream request (e.g. `Authorization: Bearer <key>`, `x-api-key`). */
  headers: ModelHeaders.default({}),
  tokenFields: ModelTokenFields.default({ returnTokenIds: false, logprobs: false, topLogprobs: 0 }),
  /** Answer `GET /v1/models` with these ids instead of asking an upstream. */
  models: z.array(z.string().min(1).max(256)).max(256).optional(),
});
export type ModelBinding = z.input<typeof ModelBinding>;
export type ModelBindingParsed = z.infer<typeof ModelBinding>;

/** Whether a job's model calls are held, and how many wait now. */
export const ModelHoldState = z.object({
  /** `POST /v1/jobs/:job/pause` holds new calls until `/resume`. */
  paused: z.boolean(),
  /** The upstreams did not answer the last call that tried them: calls wait in line while one probes. */
  upstreamDown: z.boolean(),
  /** Calls waiting (paused, unreachable, or behind those), across every gateway. */
  heldCalls: z.number().int(),
});
export type ModelHoldState = z.infer<typeof ModelHoldState>;

/** A job's model figures (docs/model-gateway.md, issue 39 point 8): summed over its recorded calls. */
export const ModelFigures = z.object({
  calls: z.number().int(),
  failedCalls: z.number().int(),
  /** Time calls spent upstream (from the request going up to the answer's end), ms. */
  upstreamMs: z.number(),
  /** Time calls spent held (job paused, upstreams unreachable, in line behind those), ms. */
  heldMs: z.number(),
  tokens: z.number().int(),
  retriesJoined: z.number().int(),
  reissues: z.number().int(),
});
export type ModelFigures = z.infer<typeof ModelFigures>;

/** `GET /v1/jobs/:job/model`: the binding with header values hidden, the hold state and the figures. */
export const ModelBindingView = z.object({
  job: z.string(),
  binding: z
    .object({
      upstreams: z.array(z.object({ baseUrl: z.string(), headers: z.array(z.string()), weight: z.number() })),
      /** Names only: the values are never shown back. */
      headers: z.array(z.string()),
      tokenFields: ModelTokenFields,
      models: z.array(z.string()).optional(),
      updatedAt: z.string(),
    })
    .nullable(),
  hold: ModelHoldState,
  figures: ModelFigures,
});
export type ModelBindingView = z.infer<typeof ModelBindingView>;

/** A rollout's limits on its model calls (set by the rollout when it starts). */
export const ModelLimits = z.object({
  maxModelCalls: z.number().int().min(1).optional(),
  maxTokens: z.number().int().min(1).optional(),
  /** Epoch ms past which no call of the rollout is held or started (its wall time). */
  deadlineMs: z.number().int().optional(),
});
export type ModelLimits = z.infer<typeof ModelLimits>;

/** What a rollout used, and which limit it hit (the first refusal's). */
export const ModelUsage = z.object({
  calls: z.number().int(),
  tokens: z.number().int(),
  limits: ModelLimits,
  hit: z.enum(['max_model_calls', 'max_tokens', 'wall_time']).optional(),
});
export type ModelUsage = z.infer<typeof ModelUsage>;

/** One try of a call upstream: a re-issue after a cut or a lost gateway adds one. */
export const ModelAttempt = z.object({
  upstream: z.string().nullable(),
  startedAt: z.string(),
  endedAt: z.string(),
  /** ok; cut (the answer stopped before its end); unreachable (no answer, or 408/429/5xx); owner_lost (the gateway running it died). */
  outcome: z.enum(['ok', 'error', 'cut', 'unreachable', 'owner_lost']),
  status: z.number().int().optional(),
  error: z.string().optional(),
  /** Of a stream cut after it began: the text the agent had received (characters), which the next attempt hid. */
  deliveredChars: z.number().int().optional(),
});
export type ModelAttempt = z.infer<typeof ModelAttempt>;

/** Token ids and logprobs an upstream gave (vLLM `return_token_ids`, `logprobs`), per choice. */
export const ModelTokens = z.object({
  promptTokenIds: z.array(z.number().int()).nullable(),
  choices: z.array(z.object({ index: z.number().int(), tokenIds: z.array(z.number().int()).nullable(), logprobs: z.array(z.number()).nullable() })),
});
export type ModelTokens = z.infer<typeof ModelTokens>;

/** A model call as recorded (once, whatever the retries), readable in the rollout's trajectory. */
export const ModelCallRecord = z.object({
  id: z.string(),
  rolloutId: z.string(),
  job: z.string(),
  /** 1, 2, ...: the call's place among the rollout's calls, by arrival. */
  turn: z.number().int(),
  /** Position in the rollout's log (by completion): the cursor of `list`. */
  seq: z.number().int(),
  api: ModelApi,
  stream: z.boolean(),
  /** The body as sent upstream (token fields injected); the added headers are not recorded. */
  request: z.unknown(),
  /** The answer: a non-streaming body, or a stream assembled into one (as the agent saw it). */
  response: z.unknown().nullable(),
  status: z.number().int(),
  outcome: z.enum(['ok', 'upstream_error', 'failed']),
  error: z.object({ code: z.string(), message: z.string() }).optional(),
  finishReason: z.string().nullable(),
  tokens: ModelTokens.nullable(),
  usage: z.object({ promptTokens: z.number().int(), completionTokens: z.number().int() }).nullable(),
  upstream: z.string().nullable(),
  attempts: z.array(ModelAttempt),
  heldMs: z.number(),
  upstreamMs: z.number(),
  retriesJoined: z.number().int(),
  receivedAt: z.string(),
  endedAt: z.string(),
});
export type ModelCallRecord = z.infer<typeof ModelCallRecord>;

export const ModelCallList = z.object({ calls: z.array(ModelCallRecord), nextAfter: z.number().int() });
export type ModelCallList = z.infer<typeof ModelCallList>;

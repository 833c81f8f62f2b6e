/**
 * Cloud burst (issue: "Cloud burst with pre-synced layers"): utilization watch,
 * eligibility, providers and the policy simulator will live here. Nothing is exported
 * yet; placement today uses only the `local` pool.
 */
export {};

import { RollboxError } from '../api/index.ts';

const UNIT_SECONDS = { s: 1, m: 60, h: 3600, d: 86_400 } as const;

// Ten years: long enough for any service token, small enough that `exp` stays a sane
// number and a typo like "1000000d" is caught instead of minting a forever-token.
const MAX_TTL_SECONDS = 10 * 365 * 86_400;

/**
 * `'45s' | '30m' | '1h' | '2d' | '3600'` (bare number = seconds) → whole seconds > 0.
 * Throws `RollboxError('invalid_request')` on anything else.
 */
export function parseTtl(input: string): number {
  const match = /^(\d{1,12})([smhd]?)$/.exec(input.trim());
  const unit = (match?.[2] || 's') as keyof typeof UNIT_SECONDS;
  const seconds = match ? Number(match[1]) * UNIT_SECONDS[unit] : Number.NaN;
  if (!Number.isSafeInteger(seconds) || seconds <= 0 || seconds > MAX_TTL_SECONDS) {
    throw new RollboxError(
      'invalid_request',
      `invalid TTL ${JSON.stringify(input)}: expected a positive whole number of seconds or <n>s, <n>m, <n>h, <n>d (e.g. 3600, 30m, 1h, 2d), at most 10 years`,
    );
  }
  return seconds;
}

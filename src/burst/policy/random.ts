/**
 * mulberry32: a tiny seeded PRNG (32-bit state, uniform in [0, 1)). The policy and the
 * simulator never call Math.random, so a seed reproduces a run exactly.
 */
export function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

/**
 * An independent generator per concern (placement, diversion share, arrivals, ...)
 * derived from one seed: what one concern draws never shifts another's sequence.
 */
export function rngStream(seed: number, concern: string): () => number {
  let h = 2_166_136_261 ^ (seed >>> 0);
  for (let i = 0; i < concern.length; i++) h = Math.imul(h ^ concern.charCodeAt(i), 16_777_619);
  return mulberry32(h >>> 0);
}

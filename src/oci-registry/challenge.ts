/**
 * `WWW-Authenticate` challenges (RFC 9110 §11.6.1): one header may carry several, e.g.
 * `Bearer realm="https://auth.example/token",service="registry",scope="repository:a:pull"`
 * or `Basic realm="registry"`. Scheme names are case-insensitive; parameter values are
 * tokens or quoted strings.
 */
export interface Challenge {
  /** Lowercased: `bearer`, `basic`. */
  scheme: string;
  params: Record<string, string>;
}

export function parseChallenges(header: string): Challenge[] {
  const challenges: Challenge[] = [];
  let i = 0;
  const skipSpaces = (): void => {
    while (i < header.length && /[\s,]/.test(header[i]!)) i++;
  };
  const token = (): string => {
    const start = i;
    while (i < header.length && /[!#$%&'*+\-.^_`|~0-9A-Za-z]/.test(header[i]!)) i++;
    return header.slice(start, i);
  };
  /** An unquoted value: a token by the RFC, but read up to the next comma (some servers send bare URLs). */
  const bare = (): string => {
    const start = i;
    while (i < header.length && !/[\s,]/.test(header[i]!)) i++;
    return header.slice(start, i);
  };
  const quoted = (): string => {
    let out = '';
    i++; // the opening quote
    while (i < header.length && header[i] !== '"') {
      if (header[i] === '\\' && i + 1 < header.length) i++;
      out += header[i++];
    }
    i++; // the closing quote
    return out;
  };
  skipSpaces();
  while (i < header.length) {
    const scheme = token();
    if (!scheme) break;
    const challenge: Challenge = { scheme: scheme.toLowerCase(), params: {} };
    challenges.push(challenge);
    for (;;) {
      skipSpaces();
      const save = i;
      const name = token();
      while (header[i] === ' ') i++;
      if (!name || header[i] !== '=') {
        i = save; // the next challenge's scheme (or a token68, which no registry sends)
        if (!name) i++;
        break;
      }
      i++; // '='
      while (header[i] === ' ') i++;
      challenge.params[name.toLowerCase()] = header[i] === '"' ? quoted() : bare();
    }
    skipSpaces();
  }
  return challenges;
}

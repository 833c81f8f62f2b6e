import http from 'node:http';

/**
 * A light JSON client for benches that drive many requests: node:http with a keep-alive
 * agent. The bench's client shares the 2-core machine with the cluster it measures (in a
 * deployment the trainer runs elsewhere), and fetch (undici, web streams) costs it about
 * twice the CPU per request.
 */
export function jsonClient(baseUrl: string, token: string, maxSockets = 64) {
  const agent = new http.Agent({ keepAlive: true, maxSockets });
  const url = new URL(baseUrl);
  return (method: string, path: string, body?: unknown): Promise<{ status: number; body: any; headers: http.IncomingHttpHeaders }> =>
    new Promise((resolve, reject) => {
      const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
      const req = http.request(
        { host: url.hostname, port: url.port, path, method, agent, headers: { authorization: `Bearer ${token}`, ...(payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {}) } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            let parsed: unknown = text;
            try {
              parsed = JSON.parse(text);
            } catch {
              /* not JSON */
            }
            resolve({ status: res.statusCode ?? 0, body: parsed, headers: res.headers });
          });
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end(payload);
    });
}

/**
 * A real stack for the Python client's tests (clients/python/tests/conftest.py starts it):
 * the same test cluster the TypeScript integration tests use, one worker host. Prints one
 * JSON line (gateway URL, redis URL, a test registry's host and tokens), then runs until its stdin closes or it is
 * sent SIGTERM, and stops everything it started.
 */
import { SCOPES } from '../../src/api/index.ts';
import { startTestCluster } from './cluster.ts';
import { startTestRegistry } from './registry.ts';

// A registry for the image pull tests (they push to it with skopeo).
const registry = await startTestRegistry();
const cluster = await startTestCluster({
  workers: [{ nodeId: 'py-node', env: { ROLLBOX_NODE_MAX_STARTING: '16' } }],
  env: { ROLLBOX_HEARTBEAT_MS: '500', ROLLBOX_REGISTRY_INSECURE: registry.host, ROLLBOX_REGISTRY_INTERNAL: registry.host },
});
let stopping: Promise<void> | undefined;
const stop = () => (stopping ??= cluster.stop().then(() => registry.stop()).finally(() => process.exit(0)));
process.once('SIGTERM', () => void stop());
process.once('SIGINT', () => void stop());
process.stdin.on('end', () => void stop()).resume();
try {
  const user = await cluster.token('py-tests', SCOPES.filter((s) => s !== 'admin' && s !== 'burst:admin'), 3600);
  const admin = await cluster.token('py-ops', ['admin'], 3600);
  const other = await cluster.token('py-other', ['sandbox:read', 'sandbox:exec'], 3600);
  process.stdout.write(`${JSON.stringify({ url: cluster.url, redisUrl: cluster.redisUrl, registry: registry.host, tokens: { user, admin, other } })}\n`);
} catch (err) {
  process.stderr.write(`python stack: ${String(err)}\n`);
  await stop();
}

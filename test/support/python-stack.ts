/**
 * A real stack for the Python client's tests (clients/python/tests/conftest.py starts it):
 * the same test cluster the TypeScript integration tests use, one worker host. Prints one
 * JSON line (gateway URL, redis URL, a test registry's host, a model job bound to a scripted upstream, and tokens), then runs until its stdin closes or it is
 * sent SIGTERM, and stops everything it started.
 */
import { SCOPES } from '../../src/api/index.ts';
import { api, startTestCluster } from './cluster.ts';
import { ScriptedUpstream } from './model-upstream.ts';
import { startTestRegistry } from './registry.ts';

// A registry for the image pull tests (they push to it with skopeo).
const registry = await startTestRegistry();
// A model upstream for the hosted-rollout tests: job MODEL_JOB's calls go to it (one turn of text).
const MODEL_JOB = 'py-rollouts';
const upstream = await ScriptedUpstream.start({ script: [{ text: 'run the tool' }] });
const cluster = await startTestCluster({
  workers: [{ nodeId: 'py-node', env: { ROLLBOX_NODE_MAX_STARTING: '16' } }],
  env: { ROLLBOX_HEARTBEAT_MS: '500', ROLLBOX_REGISTRY_INSECURE: registry.host, ROLLBOX_REGISTRY_INTERNAL: registry.host },
});
let stopping: Promise<void> | undefined;
const stop = () => (stopping ??= cluster.stop().then(() => Promise.all([registry.stop(), upstream.stop()])).then(() => undefined).finally(() => process.exit(0)));
process.once('SIGTERM', () => void stop());
process.once('SIGINT', () => void stop());
process.stdin.on('end', () => void stop()).resume();
try {
  const user = await cluster.token('py-tests', SCOPES.filter((s) => s !== 'admin' && s !== 'burst:admin'), 3600);
  const admin = await cluster.token('py-ops', ['admin'], 3600);
  const other = await cluster.token('py-other', ['sandbox:read', 'sandbox:exec'], 3600);
  const bound = await api(cluster, user, 'PUT', `/v1/jobs/${MODEL_JOB}/model`, { upstreams: [{ baseUrl: upstream.url }] });
  if (bound.status !== 200) throw new Error(`binding ${MODEL_JOB}: ${JSON.stringify(bound.body)}`);
  process.stdout.write(`${JSON.stringify({ url: cluster.url, redisUrl: cluster.redisUrl, registry: registry.host, modelJob: MODEL_JOB, tokens: { user, admin, other } })}\n`);
} catch (err) {
  process.stderr.write(`python stack: ${String(err)}\n`);
  await stop();
}

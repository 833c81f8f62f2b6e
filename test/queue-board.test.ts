import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createQueueName } from '../src/queues/jobs/index.ts';
import { launchChromium, type Chromium } from './support/cdp.ts';
import { api, startTestCluster, waitFor, type TestCluster } from './support/cluster.ts';

const SCREENSHOT = path.join(import.meta.dirname, 'artifacts', 'queue-board.png');
let cluster: TestCluster;
let chromium: Chromium | undefined;
let admin: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'board-node' }] });
  admin = await cluster.token('ops', ['admin']);
}, 120_000);
afterAll(async () => {
  await chromium?.close();
  await cluster?.stop();
});

const basic = (token: string) => `Basic ${Buffer.from(`operator:${token}`).toString('base64')}`;

describe('the queue view (bull-board)', () => {
  it('asks a browser for credentials and refuses a token without the admin scope', async () => {
    const anonymous = await fetch(`${cluster.url}/ui/queues`);
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get('www-authenticate')).toMatch(/^Basic realm=/);
    const user = await cluster.token('ops', ['sandbox:create', 'sandbox:read']);
    expect((await fetch(`${cluster.url}/ui/queues/api/queues`, { headers: { authorization: basic(user) } })).status).toBe(403);
    const ok = await fetch(`${cluster.url}/ui/queues/api/queues`, { headers: { authorization: `Bearer ${admin}` } });
    expect(ok.status).toBe(200);
    expect(ok.headers.get('content-security-policy')).toMatch(/script-src 'self'/);
  });

  it("shows a node's create queue with a create job, and a running batch task, by their ids in headless Chromium", async () => {
    const created = await api(cluster, admin, 'POST', '/v1/sandboxes', { labels: { board: 'yes' } });
    expect(created.status).toBe(201);
    chromium = await launchChromium();
    const page = await chromium.newPage();
    await page.send('Network.enable');
    await page.send('Network.setExtraHTTPHeaders', { headers: { authorization: basic(admin) } });
    const queue = createQueueName('board-node');
    await page.navigate(`${cluster.url}/ui/queues/queue/${encodeURIComponent(queue)}?status=completed`);
    const text = await page.waitFor('the create job listed', `document.body.innerText.includes(${JSON.stringify(`${created.body.id}.0`)}) && document.body.innerText`, 60_000);
    expect(text).toContain(queue);
    await page.screenshot(SCREENSHOT);
    await api(cluster, admin, 'DELETE', `/v1/sandboxes/${created.body.id}`);

    // A batch task running: its batch's queue and its job (`t.<customId>`) are listed too.
    const batch = await api(cluster, admin, 'POST', '/v1/batches', { tasks: [{ customId: 'board-task', steps: [{ cmd: 'sleep 30', timeoutMs: 60_000 }] }] });
    expect(batch.status).toBe(201);
    await waitFor('the task running', async () => (await api(cluster, admin, 'GET', `/v1/batches/${batch.body.id}`)).body.counts?.running === 1);
    await page.navigate(`${cluster.url}/ui/queues/queue/${encodeURIComponent(`batch-{${batch.body.id}}`)}?status=active`);
    await page.waitFor('the batch task listed', `document.body.innerText.includes('t.board-task')`, 60_000);
    await api(cluster, admin, 'POST', `/v1/batches/${batch.body.id}/cancel`);
  });
});

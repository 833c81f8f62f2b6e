/**
 * The command log read whole by cursor: a sandbox runs 5,000 real commands (the exec path,
 * many at once), and the log is read back a page at a time, each command once, in the order
 * they were sent, with its result.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CommandRecord, Scope } from '../src/api/index.ts';
import { RollboxClient } from '../src/client/index.ts';
import { api, startTestCluster, type TestCluster } from './support/cluster.ts';

const SCOPES: Scope[] = ['sandbox:create', 'sandbox:exec', 'sandbox:read', 'sandbox:delete'];
const COMMANDS = 5_000;
const AT_ONCE = 32;
let cluster: TestCluster;
let client: RollboxClient;
let token: string;

beforeAll(async () => {
  cluster = await startTestCluster({ workers: [{ nodeId: 'node-log' }] });
  token = await cluster.token('log', SCOPES);
  client = new RollboxClient({ baseUrl: cluster.url, token });
});
afterAll(async () => cluster?.stop());

/** Runs `count` commands `turn-<i>` (each echoes its number) through the exec path, AT_ONCE at a time. */
async function runCommands(id: string, from: number, count: number): Promise<void> {
  let next = from;
  const lane = async (): Promise<void> => {
    for (let i = next++; i < from + count; i = next++) {
      const result = await client.exec(id, { argv: ['echo', String(i)], commandId: `turn-${i}` });
      if (result.stdout !== `${i}\n`) throw new Error(`turn-${i} printed ${JSON.stringify(result.stdout)}`);
    }
  };
  await Promise.all(Array.from({ length: AT_ONCE }, lane));
}

describe('command log cursor', () => {
  it(`reads a log of ${COMMANDS} commands whole, a page at a time, each once and in the order sent`, async () => {
    const sandbox = await client.createSandbox({});
    const started = Date.now();
    await runCommands(sandbox.id, 0, COMMANDS);
    console.log(`${COMMANDS} commands in ${Date.now() - started} ms`);

    const pages: CommandRecord[][] = [];
    for (let after: string | undefined, first = true; first || after !== undefined; first = false) {
      const page = await client.commandPage(sandbox.id, { limit: 700, ...(after === undefined ? {} : { after }) });
      pages.push(page.commands);
      after = page.nextCursor;
    }
    expect(pages.map((p) => p.length)).toEqual([...Array<number>(7).fill(700), COMMANDS - 7 * 700]);
    const log = pages.flat();
    const ids = log.map((c) => c.commandId);
    expect(new Set(ids).size).toBe(COMMANDS);
    expect(new Set(ids)).toEqual(new Set(Array.from({ length: COMMANDS }, (_, i) => `turn-${i}`)));
    for (const c of log) expect(c).toMatchObject({ state: 'done', argv: ['echo', c.commandId.slice(5)], result: { exitCode: 0, stdout: `${c.commandId.slice(5)}\n` } });
    // The order sent: by the time each was queued.
    const queued = log.map((c) => Date.parse(c.queuedAt));
    expect(queued).toEqual([...queued].sort((a, b) => a - b));

    // The client's iterator pages the same log; the first page alone (older callers) is unchanged.
    const all: string[] = [];
    for await (const c of client.allCommands(sandbox.id)) all.push(c.commandId);
    expect(all).toEqual(ids);
    expect((await client.commands(sandbox.id)).map((c) => c.commandId)).toEqual(ids.slice(0, 1000));

    // A reader following the sandbox: commands sent after its last page come after `cursor`.
    let tail = await client.commandPage(sandbox.id, { after: (await lastPage(sandbox.id)).cursor! });
    expect(tail.commands).toEqual([]);
    await runCommands(sandbox.id, COMMANDS, 3);
    tail = await client.commandPage(sandbox.id, { after: tail.cursor! });
    expect(tail.commands.map((c) => c.commandId).sort()).toEqual([`turn-${COMMANDS}`, `turn-${COMMANDS + 1}`, `turn-${COMMANDS + 2}`]);
    expect(tail.nextCursor).toBeUndefined();

    // A cursor this log never gave is refused with a code.
    const bad = await api(cluster, token, 'GET', `/v1/sandboxes/${sandbox.id}/commands?after=not-a-cursor`);
    expect(bad.status).toBe(400);
    expect(bad.body.error.code).toBe('invalid_request');
    await client.deleteSandbox(sandbox.id);
    // 5,000 real execs: about 30 s on a quiet host, several times that beside a loaded suite.
  }, 300_000);
});

async function lastPage(id: string) {
  let page = await client.commandPage(id, { limit: 1000 });
  while (page.nextCursor !== undefined) page = await client.commandPage(id, { limit: 1000, after: page.nextCursor });
  return page;
}

import { describe, expect, it } from 'vitest';
import { keys } from './keys.ts';
import { renamedKey } from './migrate.ts';

describe('key layout migration names', () => {
  it('renames every key written before the hash tags to its tagged name, and leaves the others', () => {
    expect(renamedKey('rb:sbx:sbx_1')).toBe(keys.sandbox('sbx_1'));
    expect(renamedKey('rb:cmd:sbx_1:my:cmd')).toBe(keys.command('sbx_1', 'my:cmd'));
    expect(renamedKey('rb:out:sbx_1:c1')).toBe(keys.commandOutput('sbx_1', 'c1'));
    expect(renamedKey('rb:cmds:sbx_1')).toBe(keys.commandLog('sbx_1'));
    expect(renamedKey('rb:tenant:acme:live')).toBe(keys.tenantLive('acme'));
    expect(renamedKey('rb:tenant:acme:batches')).toBe(keys.tenantBatches('acme'));
    expect(renamedKey('rb:idem:acme:key:with:colons')).toBe(keys.idempotency('acme', 'key:with:colons'));
    expect(renamedKey('rb:idem-fork:acme:k')).toBe(keys.forkIdempotency('acme', 'k'));
    expect(renamedKey('rb:node:n1:sbx')).toBe(keys.nodeSandboxes('n1'));
    expect(renamedKey('rb:node:n1:stopping')).toBe(keys.nodeStopping('n1'));
    expect(renamedKey('rb:inbox:n1:ops')).toBe(keys.inbox('n1', 'ops'));
    expect(renamedKey('rb:inbox:n1:ops:taken')).toBe(`${keys.inbox('n1', 'ops')}:taken`);
    expect(renamedKey('rb:pool:ready:small:v3:n1')).toBe(keys.poolReady('small', 'v3', 'n1'));
    expect(renamedKey('rb:pool:events:small')).toBe(keys.poolEvents('small'));
    expect(renamedKey('rb:batch:bat_1')).toBe(keys.batch('bat_1'));
    expect(renamedKey('rb:batch:bat_1:results')).toBe(keys.batchResults('bat_1'));
    expect(renamedKey('rb:layer:sha256:ab')).toBe(keys.layer('sha256:ab'));
    expect(renamedKey('rb:layers')).toBe(keys.layers);
    expect(renamedKey('rb:burst:policy')).toBe(keys.burstPolicy);
    // Kept: no script touches them with another key.
    for (const key of ['rb:nodes', 'rb:unsettled', 'rb:layer-refs', 'rb:pools', keys.sandbox('sbx_1'), keys.batchResults('bat_1')]) expect(renamedKey(key)).toBeUndefined();
  });
});

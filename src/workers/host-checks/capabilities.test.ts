import { describe, expect, it } from 'vitest';
import { capabilitiesIn } from './capabilities.ts';
import { checkCapabilities } from './checks.ts';

const status = (eff: string, bnd = eff) => `Name:\tnode\nCapInh:\t0000000000000000\nCapEff:\t${eff}\nCapBnd:\t${bnd}\n`;

describe('worker host capability checks', () => {
  it('decodes capability masks by bit', () => {
    expect([...capabilitiesIn(status('0000000000200001'), 'CapEff')].sort()).toEqual(['CAP_CHOWN', 'CAP_SYS_ADMIN']);
    expect(() => capabilitiesIn('Name:\tx\n', 'CapEff')).toThrow(/CapEff/);
  });

  it('passes a full root (this VM: everything but CAP_SYS_RESOURCE)', () => {
    expect(checkCapabilities(status('000001fffeffffff'))).toEqual([]);
  });

  it('names each missing capability, fatal or not, with the compose line that grants it', () => {
    // Docker's default set only: no SYS_ADMIN, NET_ADMIN, SYS_PTRACE.
    const missing = checkCapabilities(status('00000000a80425fb'));
    expect(missing.map((m) => m.name).sort()).toEqual(['CAP_NET_ADMIN', 'CAP_SYS_ADMIN', 'CAP_SYS_PTRACE']);
    expect(missing.find((m) => m.name === 'CAP_SYS_PTRACE')).toMatchObject({ fatal: false, fix: 'cap_add: SYS_PTRACE' });
    expect(missing.find((m) => m.name === 'CAP_NET_ADMIN')).toMatchObject({ fatal: true, fix: 'cap_add: NET_ADMIN' });
    // The sandboxes' set without AUDIT_WRITE (bit 29): runc could not give it to a sandbox.
    expect(checkCapabilities(status('000001ffdeffffff')).map((m) => m.name)).toEqual(['CAP_AUDIT_WRITE']);
  });

  it('counts a capability outside the bounding set as missing (sandboxes could not be given it)', () => {
    const missing = checkCapabilities(status('000001fffeffffff', '000001fffeffdfff'));
    expect(missing.map((m) => m.name)).toEqual(['CAP_NET_RAW']);
  });
});

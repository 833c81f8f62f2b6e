import { execFileSync } from 'node:child_process';

/** The gateway a worker host's agent sandboxes reach now: the DNAT rule of its nftables table (chain gateway_dnat). */
export function dnatTargetOf(nodeId: string): { address: string; port: number } | undefined {
  const chain = execFileSync('nft', ['list', 'chain', 'inet', `rollbox-${nodeId}`, 'gateway_dnat'], { encoding: 'utf8' });
  const m = / dnat ip to (\d+\.\d+\.\d+\.\d+):(\d+)/.exec(chain);
  return m ? { address: m[1]!, port: Number(m[2]) } : undefined;
}

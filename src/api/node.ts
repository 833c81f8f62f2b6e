import { z } from 'zod';
import { NodePoolStatus } from './pool.ts';

/** What a worker host reports about itself every heartbeat. */
export const NodeHeartbeat = z.object({
  nodeId: z.string(),
  pool: z.string(),
  /** Epoch ms when the heartbeat was written, by the node's clock. */
  atMs: z.number(),
  healthy: z.boolean(),
  /** False while the host starts: adopting its sandboxes, testing its network, (a cloud host) syncing its layer set; absent means ready. */
  ready: z.boolean().optional(),
  /** diskMiB: the sum of sandbox diskMiB the node promises (scratch space x overcommit). */
  capacity: z.object({ cpuMillis: z.number(), memoryMiB: z.number(), maxSandboxes: z.number(), maxStarting: z.number(), diskMiB: z.number().optional() }),
  /** Requested resources of live sandboxes. */
  used: z.object({ cpuMillis: z.number(), memoryMiB: z.number(), diskMiB: z.number().optional() }),
  /** Measured host use, 0..1. */
  measured: z.object({
    cpuLoad: z.number(),
    memoryUsedFraction: z.number(),
    /** Pressure stall information, % of the last 10 s: memory `full` and cpu `some` avg10 (absent: an older host). */
    pressure: z.object({ memoryFullPct: z.number(), cpuSomePct: z.number() }).optional(),
  }),
  sandboxes: z.number().int(),
  starting: z.number().int(),
  cachedLayers: z.array(z.string()),
  /** Layer digests this host holds in its own store (a cloud host's pre-synced set). */
  syncedLayers: z.array(z.string()).optional(),
  /**
   * The worker host's sandbox networking, from its periodic self-test (absent: a host
   * that does not report it). Allowlist creates are placed only where it says `ok`.
   */
  network: z
    .object({
      allowlist: z.enum(['ok', 'failing']),
      checkedAtMs: z.number(),
      detail: z.string().optional(),
      /** Where rollbox's accept rules sit in the host's other rule sets (Docker's DOCKER-USER, say). */
      firewall: z.array(z.string()),
      /** Where those rules were gone (flushed by the rule set's owner) and were put back before the last round. */
      putBack: z.array(z.string()).optional(),
      /**
       * While the host has agent sandboxes (`network.gateway`): the gateway their kernel DNAT
       * rule names (`address:port`; absent before any answered) and whether the last probe
       * (each second) found one of the configured gateways answering.
       */
      gateway: z.object({ target: z.string().optional(), answering: z.boolean(), checkedAtMs: z.number() }).optional(),
    })
    .optional(),
  /** The sandbox tiers beyond `container` this host runs, with the accelerator its microVMs use (chosen at its start). */
  tiers: z.object({ microvm: z.object({ accelerator: z.enum(['kvm', 'tcg']) }).optional() }).optional(),
  /** The warm pools this host keeps: ready and starting sandboxes of each (by pool name). */
  pools: z.record(z.string(), NodePoolStatus).optional(),
  /**
   * Its sandboxes' memory: what their cgroups hold in the host's memory and in swap, and the
   * reservations swap pauses gave back to admission (MiB: what swapped sandboxes reserved
   * less what they still hold), and the guest RAM its microVMs handed back
   * (`guestUnbackedBytes`: of the guest RAM of VMs with ROLLBOX_VM_RETURN_MEMORY on, what
   * the host does not back: reported free, or never touched; absent from older hosts).
   * Absent: an older host, or no reading yet.
   */
  memory: z.object({ residentBytes: z.number(), swappedBytes: z.number(), givenBackMiB: z.number(), swappedSandboxes: z.number().int(), guestUnbackedBytes: z.number().optional() }).optional(),
  /** Where gateways reach this host's port relay (`host:port`, src/ports), for traffic into its sandboxes' ports. */
  portRelay: z.string().optional(),
  /** Create requests this node has handled (admitted or refused) recently; lets gateways drop assumed load. */
  handledCreates: z.array(z.string()),
});
export type NodeHeartbeat = z.infer<typeof NodeHeartbeat>;

export const NodeList = z.object({ nodes: z.array(NodeHeartbeat.extend({ ageMs: z.number() })) });
export type NodeList = z.infer<typeof NodeList>;

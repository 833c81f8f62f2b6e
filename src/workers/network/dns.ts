import dgram from 'node:dgram';

/**
 * The platform's DNS resolver for one sandbox: a UDP responder on the host end of its veth
 * that answers A queries for the hostnames of the sandbox's allowlist, with the addresses
 * the worker resolved when it applied the policy (the same addresses the rules let
 * through). Every other name gets NXDOMAIN and is never looked up anywhere, so a query
 * cannot carry data out (`<secret>.evil.example` stops here).
 */
export interface DnsQuestion {
  id: number;
  name: string;
  type: number;
  qclass: number;
  /** Bytes of the question section, echoed in the answer. */
  question: Buffer;
  recursionDesired: boolean;
}

const TYPE_A = 1;
const CLASS_IN = 1;
const RCODE_NXDOMAIN = 3;
const RCODE_FORMERR = 1;
const RCODE_REFUSED = 5;
const ANSWER_TTL_SECONDS = 30;

/** The first question of a query; undefined for anything that is not a plain query. */
export function parseQuery(msg: Buffer): DnsQuestion | undefined {
  if (msg.length < 12) return undefined;
  const flags = msg.readUInt16BE(2);
  const isResponse = flags & 0x8000;
  const opcode = (flags >> 11) & 0xf;
  if (isResponse || opcode !== 0 || msg.readUInt16BE(4) !== 1) return undefined;
  const labels: string[] = [];
  let at = 12;
  for (;;) {
    if (at >= msg.length) return undefined;
    const len = msg[at]!;
    if (len === 0) break;
    if (len > 63 || at + 1 + len > msg.length) return undefined; // no compression in questions
    labels.push(msg.subarray(at + 1, at + 1 + len).toString('latin1'));
    at += 1 + len;
  }
  at += 1;
  if (at + 4 > msg.length) return undefined;
  return {
    id: msg.readUInt16BE(0),
    name: labels.join('.').toLowerCase(),
    type: msg.readUInt16BE(at),
    qclass: msg.readUInt16BE(at + 2),
    question: msg.subarray(12, at + 4),
    recursionDesired: (flags & 0x0100) !== 0,
  };
}

function header(id: number, rd: boolean, rcode: number, answers: number, questions: number): Buffer {
  const h = Buffer.alloc(12);
  h.writeUInt16BE(id, 0);
  // QR=1, AA=1, RD copied, RA=0 (this server never recurses).
  h.writeUInt16BE(0x8000 | 0x0400 | (rd ? 0x0100 : 0) | rcode, 2);
  h.writeUInt16BE(questions, 4);
  h.writeUInt16BE(answers, 6);
  return h;
}

/** The answer to one query given the sandbox's name -> addresses map. */
export function answer(msg: Buffer, names: ReadonlyMap<string, readonly string[]>): Buffer | undefined {
  const q = parseQuery(msg);
  if (!q) return msg.length >= 2 ? header(msg.readUInt16BE(0), false, RCODE_FORMERR, 0, 0) : undefined;
  if (q.qclass !== CLASS_IN) return Buffer.concat([header(q.id, q.recursionDesired, RCODE_REFUSED, 0, 1), q.question]);
  const addrs = names.get(q.name);
  if (!addrs) return Buffer.concat([header(q.id, q.recursionDesired, RCODE_NXDOMAIN, 0, 1), q.question]);
  // A known name: A records; other types get an empty NOERROR answer.
  const records = q.type === TYPE_A ? addrs : [];
  const rr = records.map((ip) => {
    const b = Buffer.alloc(16);
    b.writeUInt16BE(0xc00c, 0); // pointer to the name in the question
    b.writeUInt16BE(TYPE_A, 2);
    b.writeUInt16BE(CLASS_IN, 4);
    b.writeUInt32BE(ANSWER_TTL_SECONDS, 6);
    b.writeUInt16BE(4, 10);
    ip.split('.').forEach((o, i) => b.writeUInt8(Number(o), 12 + i));
    return b;
  });
  return Buffer.concat([header(q.id, q.recursionDesired, 0, rr.length, 1), q.question, ...rr]);
}

/** A responder bound to `address:53` that answers only `client`. */
export class DnsResponder {
  /** The names it answers, with their addresses (the sandbox's /etc/hosts lists the same); replaced whole when the policy changes. */
  names: ReadonlyMap<string, readonly string[]> = new Map();
  private constructor(private readonly socket: dgram.Socket) {}

  static async start(address: string, client: string, onError: (err: Error) => void): Promise<DnsResponder> {
    const socket = dgram.createSocket({ type: 'udp4' });
    const responder = new DnsResponder(socket);
    socket.on('message', (msg, rinfo) => {
      // Another sandbox's responder is reachable on the host too; it answers only its own.
      if (rinfo.address !== client) return;
      const reply = answer(msg, responder.names);
      if (reply) socket.send(reply, rinfo.port, rinfo.address);
    });
    socket.on('error', onError);
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject);
      socket.bind(53, address, () => {
        socket.off('error', reject);
        resolve();
      });
    });
    socket.unref();
    return responder;
  }

  close(): void {
    try {
      this.socket.close();
    } catch {
      // already closed
    }
  }
}

import type { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import { RollboxError } from '../api/index.ts';
import { failureOf, type Transport } from './http.ts';
import { RateFloor } from './rate-floor.ts';

/**
 * A blob's body as a stream of exactly `sizeBytes` bytes. A registry that sends nothing for
 * `timeoutMs`, or less than the rate floor over a window, while the reader waits for bytes
 * fails it (`registry_unavailable`); a reader that is busy (a layer waiting for an
 * extraction thread) does not: the socket's own timeout is off, these run only while bytes
 * are wanted.
 */
export function meteredBlob(res: IncomingMessage, url: URL, digest: string, sizeBytes: number, t: Transport): Readable {
  res.socket?.setTimeout(0);
  let seen = 0;
  let timer: NodeJS.Timeout | undefined;
  const floor = new RateFloor(t.rateFloor, (got) => out.destroy(floor.error(`blob ${digest} from ${url.host}`, got)));
  const disarm = (): void => {
    clearTimeout(timer);
    timer = undefined;
  };
  const arm = (): void => {
    timer ??= setTimeout(() => out.destroy(new RollboxError('registry_unavailable', `blob ${digest}: ${url.host} sent nothing for ${t.timeoutMs / 1000} s (${seen} of ${sizeBytes} bytes)`)), t.timeoutMs);
    floor.want();
  };
  const out = new Readable({
    highWaterMark: 1 << 20,
    read() {
      res.resume();
      arm();
    },
    destroy(err, done) {
      disarm();
      floor.pause();
      res.destroy();
      done(err);
    },
  });
  res.pause();
  res.on('data', (chunk: Buffer) => {
    disarm();
    seen += chunk.length;
    floor.got(chunk.length);
    if (seen > sizeBytes) return void out.destroy(new RollboxError('invalid_image', `blob ${digest}: more than the ${sizeBytes} bytes the manifest says`));
    if (out.push(chunk)) arm();
    else {
      res.pause();
      floor.pause();
    }
  });
  res.once('end', () => {
    disarm();
    floor.pause();
    if (seen === sizeBytes) out.push(null);
    else out.destroy(new RollboxError('registry_unavailable', `blob ${digest}: ${url.host} sent ${seen} of its ${sizeBytes} bytes`));
  });
  const cut = (err?: unknown): void => void out.destroy(err ? failureOf(url, err, t) : new RollboxError('registry_unavailable', `blob ${digest}: ${url.host} closed the connection after ${seen} of ${sizeBytes} bytes`));
  res.once('error', cut);
  res.once('aborted', () => cut());
  return out;
}

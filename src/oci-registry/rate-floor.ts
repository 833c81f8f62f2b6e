import { RollboxError } from '../api/index.ts';

export interface RateFloorOptions {
  /** 0: no floor. */
  minBytesPerSecond: number;
  windowMs: number;
}

/**
 * The slowest a registry may send a body the pull is waiting for. Time counts only while
 * the reader wants bytes (`want` .. `pause`): a window in which it wanted them throughout
 * and got fewer than the floor's worth fails the body (`onSlow`); a reader that stopped
 * asking (a layer waiting for an extraction thread) drops the window. This is what stops a
 * registry that trickles a byte every few seconds, which no idle timeout notices.
 */
export class RateFloor {
  private timer: NodeJS.Timeout | undefined;
  private wanted = false;
  private bytes = 0;

  constructor(
    private readonly options: RateFloorOptions,
    private readonly onSlow: (bytesInWindow: number) => void,
  ) {}

  /** The reader waits for bytes: a window starts unless one runs. */
  want(): void {
    this.wanted = true;
    if (this.timer || this.options.minBytesPerSecond <= 0) return;
    this.bytes = 0;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (this.bytes < (this.options.minBytesPerSecond * this.options.windowMs) / 1000) this.onSlow(this.bytes);
      else if (this.wanted) this.want();
    }, this.options.windowMs);
    this.timer.unref();
  }

  got(bytes: number): void {
    this.bytes += bytes;
  }

  /** The reader has what it can take for now: this window does not count. */
  pause(): void {
    this.wanted = false;
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** The coded failure of a body that was too slow. */
  error(what: string, bytesInWindow: number): RollboxError {
    return new RollboxError('registry_unavailable', `${what}: ${bytesInWindow} bytes in ${this.options.windowMs / 1000} s, under the floor of ${this.options.minBytesPerSecond} bytes/s (ROLLBOX_IMAGE_PULL_MIN_BYTES_PER_S)`);
  }
}

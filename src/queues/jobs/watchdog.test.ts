import { describe, expect, it } from 'vitest';
import { JobWorkerWatchdog, type WatchedWorker } from './watchdog.ts';

/** A worker whose counters the test sets, standing for BullMQ's (the watchdog reads only these). */
function worker(state: { active: number; started: number; waiting: number }) {
  const restarts: number[] = [];
  const watched: WatchedWorker = {
    active: () => state.active,
    started: () => state.started,
    waiting: async () => state.waiting,
    restart: async () => void restarts.push(state.waiting),
  };
  return { watched, restarts };
}

describe('JobWorkerWatchdog', () => {
  it('restarts a worker that started nothing over two looks while jobs waited', async () => {
    const state = { active: 0, started: 5, waiting: 3 };
    const { watched, restarts } = worker(state);
    const dog = new JobWorkerWatchdog(watched, 1000, () => {}, (err) => { throw err; });
    await dog.check();
    expect(restarts).toEqual([]);
    await dog.check();
    expect(restarts).toEqual([3]);
  });

  it('leaves alone a worker that is fetching, busy, or has nothing to fetch', async () => {
    const state = { active: 0, started: 5, waiting: 3 };
    const { watched, restarts } = worker(state);
    const dog = new JobWorkerWatchdog(watched, 1000, () => {}, (err) => { throw err; });
    await dog.check();
    state.started = 6; // it took one meanwhile
    await dog.check();
    state.active = 2; // busy: jobs waiting is its concurrency at work
    await dog.check();
    await dog.check();
    state.active = 0;
    state.waiting = 0;
    await dog.check();
    await dog.check();
    expect(restarts).toEqual([]);
  });
});

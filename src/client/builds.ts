import { createHash } from 'node:crypto';
import { Build, BuildContext, BuildLogEvent, type BuildRequest } from '../api/index.ts';
import { json, serverSentEvents } from './body.ts';
import type { RollboxClient } from './client.ts';
import { RollboxApiError } from './errors.ts';

/** A build's log as it streams: a step's change (`steps`: how many the build has), a failed RUN's output, then the end (with the build). */
export type BuildStreamEvent = BuildLogEvent & { steps?: number; build?: Build };

/**
 * Image builds (scope image:build) over a RollboxClient: a context (a tar) uploaded once
 * by its digest, a build started naming it, its log followed as server-sent events.
 */
export class BuildsClient {
  constructor(private readonly client: RollboxClient) {}

  /**
   * Uploads a build context (a tar, in memory): checked whole by the gateway, kept by its
   * digest. Bytes the tenant's gateway still keeps are not sent again (a rebuild sends a
   * digest). The same bytes give the same digest, so a retry is safe.
   */
  async uploadContext(archive: Uint8Array): Promise<BuildContext> {
    const digest = `sha256:${createHash('sha256').update(archive).digest('hex')}`;
    try {
      return BuildContext.parse(await this.client.request('GET', `/v1/images/builds/contexts/${digest}`, {}, json));
    } catch (err) {
      if (!(err instanceof RollboxApiError && err.status === 404)) throw err;
    }
    const init = { headers: { 'content-type': 'application/x-tar' }, body: archive as unknown as BodyInit };
    return BuildContext.parse(await this.client.request('POST', '/v1/images/builds/contexts', init, json));
  }

  /** Starts a build (`queued`); a Dockerfile that does not parse is refused here, naming its line. Not retried: a retry would start a second build. */
  async startBuild(request: Partial<BuildRequest> & Pick<BuildRequest, 'name'>): Promise<Build> {
    const init = { headers: { 'content-type': 'application/json' }, body: JSON.stringify(request), retry: 'refused' as const };
    return Build.parse(await this.client.request('POST', '/v1/images/builds', init, json));
  }

  async getBuild(id: string): Promise<Build> {
    return Build.parse(await this.client.request('GET', `/v1/images/builds/${encodeURIComponent(id)}`, {}, json));
  }

  /** The build's log from its start (or after `after`), until it ends; reconnects where it left off when the stream is cut. */
  async *events(id: string, after = -1): AsyncGenerator<BuildStreamEvent> {
    for (;;) {
      const body = await this.client.request('GET', `/v1/images/builds/${encodeURIComponent(id)}/events?after=${after}`, { headers: { accept: 'text/event-stream' } }, async (r) => r.body);
      if (!body) throw new RollboxApiError(502, 'internal', 'the build log answered without a body');
      for await (const sse of serverSentEvents(body)) {
        const event = JSON.parse(sse.data) as BuildStreamEvent;
        after = event.seq;
        yield event;
        if (event.kind === 'end') return;
      }
    }
  }

  /** Follows the build to its end: the build record (`ready` or `failed`, with the failed step's output). */
  async waitForBuild(id: string, onEvent?: (event: BuildStreamEvent) => void): Promise<Build> {
    for await (const event of this.events(id)) onEvent?.(event);
    return this.getBuild(id);
  }
}

import { FileEntry, FilesList, MakeDirResult, MoveResult, RemoveResult } from '../api/index.ts';
import { json } from './body.ts';
import type { RollboxClient } from './client.ts';

/**
 * A sandbox's files beyond reading and writing them (RollboxClient.readFile/writeFile):
 * stat, list, mkdir, move, remove. Each call is idempotent in effect
 * (mkdir -p, rm -rf, a move whose source is gone answers not_found), so retried as usual.
 */
export class SandboxFilesClient {
  constructor(private readonly client: RollboxClient) {}

  async stat(id: string, path: string): Promise<FileEntry> {
    return FileEntry.parse(await this.client.request('GET', `${base(id)}/files/stat?${new URLSearchParams({ path })}`, {}, json));
  }

  async list(id: string, path: string, depth = 1): Promise<FileEntry[]> {
    return FilesList.parse(await this.client.request('GET', `${base(id)}/files/list?${new URLSearchParams({ path, depth: String(depth) })}`, {}, json)).entries;
  }

  async makeDir(id: string, path: string): Promise<MakeDirResult> {
    return MakeDirResult.parse(await this.client.request('POST', `${base(id)}/files/mkdir`, body({ path }), json));
  }

  async move(id: string, source: string, destination: string): Promise<FileEntry> {
    return MoveResult.parse(await this.client.request('POST', `${base(id)}/files/move`, body({ source, destination }), json)).entry;
  }

  async remove(id: string, path: string): Promise<RemoveResult> {
    return RemoveResult.parse(await this.client.request('DELETE', `${base(id)}/files?${new URLSearchParams({ path })}`, {}, json));
  }
}

const base = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}`;
const body = (value: unknown) => ({ headers: { 'content-type': 'application/json' }, body: JSON.stringify(value) });

import { createHash } from 'node:crypto';
import type { GatewayApp } from '../routes/common.ts';
import { CONSOLE_BODY, CONSOLE_SCRIPT, CONSOLE_STYLE } from './console-page.ts';
import { DOM_SCRIPT } from './dom-script.ts';
import { PAGE_BODY, PAGE_SCRIPT, PAGE_STYLE } from './page.ts';

const sha256 = (text: string) => `'sha256-${createHash('sha256').update(text).digest('base64')}'`;

/** A page's document and headers: its one script and one style, named by hash in its policy. */
function pageOf(title: string, body: string, script: string, style: string): { html: string; headers: Record<string, string> } {
  const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>${title}</title>
<link rel="icon" href="data:,">
<style>${style}</style>
</head>
<body>${body}
<script>${script}</script>
</body>
</html>
`;
  /**
   * Only this page's own script and style run (by hash), it talks to its own origin only,
   * and nothing can frame it: markup slipped into the page could not run even if it got in.
   */
  const headers = {
    'content-security-policy': [
      "default-src 'none'",
      `script-src ${sha256(script)}`,
      `style-src ${sha256(style)}`,
      "connect-src 'self'",
      'img-src data:',
      "base-uri 'none'",
      "form-action 'none'",
      "frame-ancestors 'none'",
    ].join('; '),
    'referrer-policy': 'no-referrer',
    'x-content-type-options': 'nosniff',
    'cache-control': 'no-store',
  };
  return { html, headers };
}

const BATCH_PAGE = pageOf('rollbox batches', PAGE_BODY, DOM_SCRIPT + PAGE_SCRIPT, PAGE_STYLE);
const CONSOLE_PAGE = pageOf('rollbox console', CONSOLE_BODY, DOM_SCRIPT + CONSOLE_SCRIPT, CONSOLE_STYLE);

/**
 * GET /ui: a page where a submitter watches their batches (progress, counts, throughput,
 * the slowest and the failed tasks) and cancels one. The page itself is public; it asks
 * for a token (kept in sessionStorage, or given as `#token=` in a link's fragment, which
 * never reaches the server) and calls /v1/batches with it.
 */
export function registerBatchPage(app: GatewayApp): void {
  for (const path of ['/ui', '/ui/']) app.get(path, (c) => c.html(BATCH_PAGE.html, 200, BATCH_PAGE.headers));
}

/**
 * GET /ui/console: the operator console (nodes, warm pools, the seed's signals over time,
 * burst, capacity, the burst simulator). Public like the batch page; the data it polls
 * (/v1/cluster/console) wants scope cluster:read or admin.
 */
export function registerConsolePage(app: GatewayApp): void {
  app.get('/ui/console', (c) => c.html(CONSOLE_PAGE.html, 200, CONSOLE_PAGE.headers));
}

import { createHash } from 'node:crypto';
import type { GatewayApp } from '../routes/common.ts';
import { PAGE_BODY, PAGE_SCRIPT, PAGE_STYLE } from './page.ts';

const sha256 = (text: string) => `'sha256-${createHash('sha256').update(text).digest('base64')}'`;

const HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>rollbox batches</title>
<link rel="icon" href="data:,">
<style>${PAGE_STYLE}</style>
</head>
<body>${PAGE_BODY}
<script>${PAGE_SCRIPT}</script>
</body>
</html>
`;

/**
 * Only this page's own script and style run (by hash), it talks to its own origin only,
 * and nothing can frame it: markup slipped into the page could not run even if it got in.
 */
const HEADERS = {
  'content-security-policy': [
    "default-src 'none'",
    `script-src ${sha256(PAGE_SCRIPT)}`,
    `style-src ${sha256(PAGE_STYLE)}`,
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

/**
 * GET /ui: a page where a submitter watches their batches (progress, counts, throughput,
 * the slowest and the failed tasks) and cancels one. The page itself is public; it asks
 * for a token (kept in sessionStorage, or given as `#token=` in a link's fragment, which
 * never reaches the server) and calls /v1/batches with it.
 */
export function registerBatchPage(app: GatewayApp): void {
  for (const path of ['/ui', '/ui/']) app.get(path, (c) => c.html(HTML, 200, HEADERS));
}

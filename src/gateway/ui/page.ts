/**
 * The batch page: one self-contained document (inline CSS and vanilla JS, nothing fetched
 * but the /v1 API). Everything that comes from the API reaches the DOM as text
 * (textContent and text nodes), never as markup. The script and the style are separate
 * strings so the server can name them by hash in its Content-Security-Policy.
 */

export const PAGE_STYLE = String.raw`
:root { --ok: #2f9e5b; --failed: #d64545; --timeout: #e0891b; --infra: #8a5cd1; --cancelled: #9aa0a6; --running: #8fb8e8;
  --line: #e3e5e8; --muted: #6b7280; --bg: #f7f8fa; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); }
header { display: flex; gap: 16px; align-items: center; padding: 10px 20px; background: #fff; border-bottom: 1px solid var(--line); flex-wrap: wrap; }
h1 { font-size: 17px; margin: 0 12px 0 0; } h2 { font-size: 16px; margin: 0; } h3 { font-size: 14px; margin: 18px 0 6px; }
form { display: flex; gap: 6px; } input { width: 320px; padding: 5px 8px; border: 1px solid #c9ccd1; border-radius: 5px; font: inherit; }
button { padding: 5px 12px; border: 1px solid #c9ccd1; border-radius: 5px; background: #fff; font: inherit; cursor: pointer; }
button:hover { background: #f0f1f3; } button.danger { border-color: var(--failed); color: var(--failed); }
#status { color: var(--muted); font-size: 12px; margin-left: auto; } #status.error { color: var(--failed); }
main { display: grid; grid-template-columns: minmax(360px, 5fr) 7fr; gap: 20px; padding: 20px; align-items: start; }
@media (max-width: 900px) { main { grid-template-columns: 1fr; } }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px; min-width: 0; }
ul { list-style: none; margin: 10px 0 0; padding: 0; }
li.batch { padding: 10px; border: 1px solid var(--line); border-radius: 6px; margin-bottom: 8px; cursor: pointer; }
li.batch:hover { border-color: #b9bec6; } li.batch.selected { border-color: #4a7fd0; box-shadow: 0 0 0 1px #4a7fd0; }
.row { display: flex; gap: 10px; align-items: baseline; flex-wrap: wrap; }
.muted { color: var(--muted); } .small { font-size: 12px; } code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
.state { font-size: 11px; padding: 1px 7px; border-radius: 9px; background: #e8eaed; text-transform: uppercase; letter-spacing: .03em; }
.state.in_progress, .state.validating, .state.finalizing { background: #dbe8fa; color: #1d4f91; }
.state.completed { background: #dcf1e3; color: #1d6b3c; } .state.failed, .state.expired { background: #f9dede; color: #9b2121; }
.state.cancelling, .state.cancelled { background: #ececec; color: #555; }
.bar { display: flex; height: 10px; margin: 8px 0 6px; background: #eceef1; border-radius: 5px; overflow: hidden; }
.seg { height: 100%; } .s-succeeded { background: var(--ok); } .s-failed { background: var(--failed); } .s-timeout { background: var(--timeout); }
.s-infra_error { background: var(--infra); } .s-cancelled { background: var(--cancelled); } .s-running { background: var(--running); } .s-queued { background: #dfe2e6; }
.counts { display: flex; gap: 4px 12px; flex-wrap: wrap; font-size: 12px; }
.count .dot { display: inline-block; width: 8px; height: 8px; border-radius: 2px; margin-right: 4px; } .count.zero { color: #a4a9b0; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 10px 0; font-size: 13px; } dt { color: var(--muted); } dd { margin: 0; }
table { width: 100%; border-collapse: collapse; font-size: 13px; } th { text-align: left; color: var(--muted); font-weight: 500; }
th, td { padding: 4px 6px; border-bottom: 1px solid var(--line); vertical-align: top; } td.num { text-align: right; white-space: nowrap; }
pre { margin: 0; max-height: 110px; overflow: auto; white-space: pre-wrap; word-break: break-all; font: 11px ui-monospace, Menlo, monospace; background: #f6f7f9; padding: 4px 6px; border-radius: 4px; }
.error { color: var(--failed); }
`;

export const PAGE_SCRIPT = String.raw`
const DONE = ['succeeded', 'failed', 'timeout', 'infra_error', 'cancelled'];
const FAILED = ['failed', 'timeout', 'infra_error'];
const TERMINAL = ['completed', 'cancelled', 'failed', 'expired'];
const PAGE = 1000, MAX_FAILED = 200, POLL_MS = 2000, IDLE_MS = 10000;
let selected = null, detail = null, batches = [], timer = 0, busy = false, again = false;

// A link may carry a batch in its fragment beside the token (DOM_SCRIPT took that).
selected = fragment.get('batch') || null;
showFragment();

function showFragment() {
  history.replaceState(null, '', location.pathname + location.search + (selected ? '#batch=' + encodeURIComponent(selected) : ''));
}

const doneOf = (c) => DONE.reduce((sum, s) => sum + c[s], 0);
const label = (s) => s.replace('_', ' ');
const when = (iso) => (iso ? new Date(iso).toLocaleString() : '—');
const duration = (ms) => (ms < 1000 ? Math.round(ms) + ' ms' : (ms / 1000).toFixed(ms < 10000 ? 2 : 0) + ' s');

/** Tasks finished per second since the batch went in_progress (until its tasks ended, or now). */
function throughput(b) {
  const start = Date.parse(b.timestamps.in_progress || '');
  const endIso = b.timestamps.finalizing || (TERMINAL.includes(b.state) ? b.timestamps[b.state] : '');
  const elapsed = ((endIso ? Date.parse(endIso) : Date.now()) - start) / 1000;
  if (!(elapsed > 0)) return '—';
  const rate = doneOf(b.counts) / elapsed;
  return (rate >= 10 ? rate.toFixed(0) : rate.toFixed(2)) + ' tasks/s';
}

function bar(c) {
  const total = Math.max(1, c.total);
  return el('div', { class: 'bar', role: 'progressbar', 'aria-label': 'progress', 'aria-valuemin': 0, 'aria-valuemax': c.total, 'aria-valuenow': doneOf(c) },
    [...DONE, 'running'].filter((s) => c[s] > 0).map((s) => el('span', { class: 'seg s-' + s, 'data-status': s, title: label(s) + ': ' + c[s], style: { width: (100 * c[s] / total).toFixed(2) + '%' } })));
}

function counts(c) {
  return el('div', { class: 'counts' }, ['queued', 'running', ...DONE].map((s) =>
    el('span', { class: 'count' + (c[s] ? '' : ' zero'), 'data-count': s }, el('i', { class: 'dot s-' + s }), label(s) + ' ', el('b', {}, c[s]))));
}

const metadata = (m) => Object.entries(m || {}).map(([k, v]) => k + '=' + v).join('  ');

function renderList() {
  $('batches').replaceChildren(...batches.map((b) => {
    const c = b.counts, done = doneOf(c), open = () => select(b.id);
    return el('li', { class: 'batch' + (b.id === selected ? ' selected' : ''), 'data-batch-id': b.id, 'data-state': b.state, tabindex: 0, role: 'button', onclick: open,
      onkeydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); open(); } } },
    el('div', { class: 'row' }, el('code', {}, b.id), el('span', { class: 'state ' + b.state }, label(b.state)), el('span', { class: 'muted small' }, when(b.createdAt))),
    bar(c),
    el('div', { class: 'row small' }, el('b', {}, done + ' / ' + c.total), el('span', { class: 'muted' }, (c.total ? Math.floor(100 * done / c.total) : 0) + '% done'),
      el('span', { class: 'muted', 'data-throughput': '' }, throughput(b)), el('span', { class: 'muted' }, metadata(b.options.metadata))),
    counts(c));
  }));
  $('empty').hidden = batches.length > 0;
}

/** Keeps what the detail shows, not every line: the 10 slowest and the first failed ones. */
function addLine(d, line) {
  d.seen++;
  const ms = line.steps.reduce((sum, s) => sum + s.durationMs, 0);
  d.slowest.push({ customId: line.customId, status: line.status, ms, attempts: line.attempts });
  d.slowest.sort((a, b) => b.ms - a.ms);
  d.slowest.length = Math.min(d.slowest.length, 10);
  if (!FAILED.includes(line.status)) return;
  d.failedCount++;
  if (d.failed.length >= MAX_FAILED) return;
  const step = line.grade && !line.grade.passed ? line.grade : line.steps[line.steps.length - 1];
  const how = !step ? '' : step.timedOut ? 'timed out' : step.oomKilled ? 'out of memory' : 'exit ' + step.exitCode;
  const stderr = step ? step.stderr : '';
  d.failed.push({ customId: line.customId, status: line.status, how: (line.grade && !line.grade.passed ? 'grade: ' : '') + how, attempts: line.attempts,
    error: line.error ? line.error.code + ': ' + line.error.message : '', stderr: stderr.length > 800 ? '…' + stderr.slice(-800) : stderr });
}

async function loadDetail() {
  if (!detail || detail.id !== selected) detail = { id: selected, batch: null, cursor: '', seen: 0, slowest: [], failed: [], failedCount: 0, complete: false };
  const d = detail, path = '/v1/batches/' + encodeURIComponent(d.id);
  d.batch = await (await call('GET', path)).json();
  // Read before the results: once terminal, the lines read after it are all there are.
  const terminal = TERMINAL.includes(d.batch.state);
  while (!d.complete) {
    const r = await call('GET', path + '/results?limit=' + PAGE + (d.cursor ? '&after=' + encodeURIComponent(d.cursor) : ''));
    const lines = (await r.text()).split('\n').filter(Boolean).map((l) => JSON.parse(l));
    lines.forEach((l) => addLine(d, l));
    d.cursor = r.headers.get('x-rollbox-cursor') || d.cursor;
    if (lines.length < PAGE) { d.complete = terminal; break; }
  }
  if (detail === d) renderDetail();
}

function table(head, rows) { return el('table', {}, el('thead', {}, el('tr', {}, head.map((h) => el('th', {}, h)))), el('tbody', {}, rows)); }

function renderDetail() {
  const d = detail, b = d.batch, o = b.options, c = b.counts;
  const cancellable = b.state === 'validating' || b.state === 'in_progress';
  $('detail').hidden = false;
  $('detail').setAttribute('data-batch-id', b.id);
  $('detail').toggleAttribute('data-complete', d.complete);
  $('detail').replaceChildren(...[
    el('div', { class: 'row' }, el('h2', {}, 'Batch ', el('code', {}, b.id)), el('span', { class: 'state ' + b.state, 'data-state': b.state }, label(b.state)),
      el('span', { style: { marginLeft: 'auto' } }, cancellable ? el('button', { id: 'cancel', class: 'danger', onclick: () => cancel(b.id) }, 'Cancel batch') : null, ' ', el('button', { onclick: () => select(null) }, 'Close'))),
    bar(c), counts(c),
    b.error ? el('p', { class: 'error' }, b.error.code + ': ' + b.error.message) : null,
    el('dl', {}, [['tasks', c.total], ['throughput', throughput(b)], ['max concurrency', o.maxConcurrency], ['max attempts', o.maxAttempts], ['class', o.class],
      ['metadata', metadata(o.metadata) || '—'], ['created', when(b.createdAt)], ['expires', when(b.expiresAt)],
      ...Object.entries(b.timestamps).map(([s, t]) => [label(s), when(t)])].map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)])),
    el('h3', {}, 'Slowest tasks'),
    d.slowest.length ? table(['task', 'status', 'attempts', 'steps took'], d.slowest.map((t) => el('tr', { 'data-custom-id': t.customId, 'data-duration-ms': t.ms },
      el('td', {}, el('code', {}, t.customId)), el('td', {}, label(t.status)), el('td', { class: 'num' }, t.attempts), el('td', { class: 'num' }, duration(t.ms))))) : el('p', { class: 'muted' }, 'No results yet.'),
    el('h3', {}, 'Failed tasks (' + d.failedCount + ')' + (d.failedCount > d.failed.length ? ', the first ' + d.failed.length : '')),
    d.failed.length ? el('div', { id: 'failed' }, table(['task', 'status', 'exit / error', 'stderr (tail)'], d.failed.map((t) => el('tr', { 'data-custom-id': t.customId },
      el('td', {}, el('code', {}, t.customId)), el('td', {}, label(t.status)), el('td', {}, t.how, t.error ? el('div', { class: 'error small' }, t.error) : null),
      el('td', {}, t.stderr ? el('pre', {}, t.stderr) : el('span', { class: 'muted' }, '—')))))) : el('p', { class: 'muted' }, 'None.'),
    el('p', { class: 'muted small' }, d.seen + ' results read' + (d.complete ? '.' : '; following…')),
  ].filter(Boolean));
}

async function refresh() {
  if (busy) { again = true; return; }
  busy = true;
  clearTimeout(timer);
  let stop = false;
  try {
    if (!token) { setStatus('Enter a token with scope batch:submit.'); stop = true; return; }
    batches = (await (await call('GET', '/v1/batches?limit=100')).json()).batches;
    renderList();
    if (selected) await loadDetail();
    setStatus('Updated ' + new Date().toLocaleTimeString());
  } catch (e) {
    setStatus(e.message, true);
    stop = e.status === 401 || e.status === 403;
    if (e.status === 404 && selected) { selected = null; detail = null; $('detail').hidden = true; showFragment(); }
  } finally {
    busy = false;
    if (again) { again = false; void refresh(); } else if (!stop) {
      const active = batches.some((b) => !TERMINAL.includes(b.state)) || (detail && !detail.complete);
      timer = setTimeout(refresh, active ? POLL_MS : IDLE_MS);
    }
  }
}

function select(id) {
  selected = id;
  showFragment();
  if (!id) { detail = null; $('detail').hidden = true; }
  renderList();
  void refresh();
}

async function cancel(id) {
  if (!confirm('Cancel batch ' + id + '? Queued tasks end now, running ones soon; results so far stay.')) return;
  try { await call('POST', '/v1/batches/' + encodeURIComponent(id) + '/cancel'); } catch (e) { setStatus(e.message, true); }
  void refresh();
}

$('auth').addEventListener('submit', (e) => {
  e.preventDefault();
  token = $('token').value.trim();
  sessionStorage.setItem('rollbox.token', token);
  detail = null;
  void refresh();
});
$('forget').addEventListener('click', () => { token = ''; $('token').value = ''; sessionStorage.removeItem('rollbox.token'); batches = []; select(null); });
$('token').value = token;
void refresh();
`;

export const PAGE_BODY = `
<header>
  <h1>rollbox batches</h1>
  <form id="auth" autocomplete="off">
    <input id="token" type="password" placeholder="Bearer token (scope batch:submit)" aria-label="token">
    <button type="submit">Use token</button><button type="button" id="forget">Forget</button>
  </form>
  <span id="status" role="status"></span>
</header>
<main>
  <section><h2>Your batches</h2><p id="empty" class="muted" hidden>No batches yet.</p><ul id="batches"></ul></section>
  <section id="detail" hidden></section>
</main>`;

/** The console page's script (see console-page.ts; it follows DOM_SCRIPT): polls /v1/cluster/console and draws it. */
export const CONSOLE_SCRIPT = String.raw`
const POLL_MS = 2000;
const COLORS = ['#4a7fd0', '#d64545', '#2f9e5b', '#e0891b', '#8a5cd1', '#6b7280'];
let timer = 0, busy = false;
if (fragment.get('token')) history.replaceState(null, '', location.pathname + location.search);

const dash = '—';
const num = (x, digits) => (x === null || x === undefined ? dash : Number(x).toLocaleString('en-US', { maximumFractionDigits: digits === undefined ? 2 : digits }));
const ms = (x) => (x === null || x === undefined ? dash : x < 1000 ? num(x, 1) + ' ms' : x < 120000 ? num(x / 1000, 2) + ' s' : num(x / 60000, 1) + ' min');
const pct = (x) => (x === null || x === undefined ? dash : num(100 * x, 1) + '%');
const mib = (x) => (x >= 1024 ? num(x / 1024, 1) + ' GiB' : num(x, 0) + ' MiB');

/** A figure tile; data-figure and data-value carry the raw number the API gave (what the tests compare). */
function figure(key, label, value, text) {
  return el('div', { class: 'figure', 'data-figure': key, 'data-value': value === null || value === undefined ? 'null' : String(value) }, el('div', { class: 'k' }, label), el('div', { class: 'v' }, text));
}
function table(head, rows) { return el('table', {}, el('thead', {}, el('tr', {}, head.map((h) => el('th', {}, h)))), el('tbody', {}, rows)); }

/** A round step for about n ticks over a span. */
function niceStep(span, n) {
  const raw = span / Math.max(1, n), p = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
}

/**
 * A line chart of series over time: at most 5 time ticks and 4 value ticks (thinned to
 * what fits), labelled with as many decimals as their step has (so no two read alike),
 * whole numbers only for counts (opts.integer), the unit beside the title, the legend
 * below the plot (never on the data).
 */
function lineChart(title, unit, series, fromMs, toMs, opts) {
  const W = 360, H = 150, L = 46, R = 8, T = 8, B = 22, pw = W - L - R, ph = H - T - B;
  const ys = series.flatMap((s) => s.points.map((p) => p.y)).filter((y) => y !== null && Number.isFinite(y));
  const peak = Math.max(...ys, 0) || 1;
  const step = Math.max(opts && opts.integer ? 1 : 0, niceStep(peak, 4)), top = Math.max(step, Math.ceil(peak / step) * step);
  const decimals = Math.min(3, (String(step).split('.')[1] || '').length), format = (v) => num(v, decimals);
  const x = (t) => L + ((t - fromMs) / Math.max(1, toMs - fromMs)) * pw, y = (v) => T + ph - (v / top) * ph;
  const kids = [svg('rect', { class: 'frame', x: L, y: T, width: pw, height: ph })];
  for (let v = 0; v <= top + 1e-9; v += step) {
    kids.push(svg('line', { class: 'grid', x1: L, x2: L + pw, y1: y(v), y2: y(v) }), svg('text', { class: 'axis', x: L - 4, y: y(v) + 3, 'text-anchor': 'end' }, format(v)));
  }
  const spanMin = (toMs - fromMs) / 60000, tickMin = [1, 2, 5, 10, 15, 30, 60].find((m) => spanMin / m <= 5) || 60;
  for (let t = Math.ceil(fromMs / (tickMin * 60000)) * tickMin * 60000; t <= toMs; t += tickMin * 60000) {
    const d = new Date(t);
    kids.push(svg('text', { class: 'axis', x: x(t), y: H - 6, 'text-anchor': 'middle' }, String(d.getHours()).padStart(2, '0') + ':' + String(d.getMinutes()).padStart(2, '0')));
  }
  series.forEach((s, i) => {
    let path = '', pen = false;
    for (const p of s.points) {
      if (p.y === null || !Number.isFinite(p.y)) { pen = false; continue; }
      path += (pen ? 'L' : 'M') + x(p.x).toFixed(1) + ' ' + y(p.y).toFixed(1) + ' ';
      pen = true;
    }
    if (path) kids.push(svg('path', { d: path, fill: 'none', stroke: COLORS[i % COLORS.length], 'stroke-width': 1.6 }));
    for (const p of s.points) if (p.y !== null && Number.isFinite(p.y)) kids.push(svg('circle', { cx: x(p.x).toFixed(1), cy: y(p.y).toFixed(1), r: 1.6, fill: COLORS[i % COLORS.length] }));
  });
  return el('div', { class: 'chart', 'data-chart': title },
    el('div', { class: 'title' }, title, el('span', { class: 'muted unit' }, ' · ' + unit)),
    svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': title + ' (' + unit + ')' }, kids),
    el('div', { class: 'legend' }, series.map((s, i) => el('span', {}, el('i', { style: { background: COLORS[i % COLORS.length] } }), s.label))));
}

function renderNodes(s) {
  const rows = s.nodes.map((n) => {
    const p = n.measured.pressure, net = n.network, pools = Object.entries(n.pools || {});
    return el('tr', { 'data-node-id': n.nodeId, 'data-sandboxes': n.sandboxes },
      el('td', {}, el('code', {}, n.nodeId), n.pool === 'cloud' ? el('span', { class: 'tag cloud' }, 'burst host') : null),
      el('td', {}, n.pool),
      el('td', { class: n.healthy ? 'ok' : 'bad' }, n.healthy ? (n.ready === false ? 'starting' : 'healthy') : 'unhealthy', el('div', { class: 'muted small' }, 'beat ' + num(n.ageMs / 1000, 1) + ' s ago')),
      el('td', { class: 'num', 'data-col': 'sandboxes' }, n.sandboxes, n.starting ? el('div', { class: 'muted small' }, n.starting + ' starting') : null),
      el('td', { class: 'num' }, num(n.used.cpuMillis / 1000, 2) + ' / ' + num(n.capacity.cpuMillis / 1000, 1) + ' cores', el('div', { class: 'muted small' }, 'load ' + pct(n.measured.cpuLoad))),
      el('td', { class: 'num' }, mib(n.used.memoryMiB) + ' / ' + mib(n.capacity.memoryMiB), el('div', { class: 'muted small' }, 'host ' + pct(n.measured.memoryUsedFraction) + ' used')),
      el('td', { class: 'num', 'data-col': 'memory-held' }, n.memory ? [mib(n.memory.residentBytes / 1048576) + ' in RAM', el('div', { class: 'muted small' }, mib(n.memory.swappedBytes / 1048576) + ' in swap · ' + mib(n.memory.givenBackMiB) + ' given back (' + n.memory.swappedSandboxes + ' swapped)' + (n.memory.guestUnbackedBytes ? ' · ' + mib(n.memory.guestUnbackedBytes / 1048576) + ' of microVM guest RAM handed back' : ''))] : dash),
      el('td', { class: 'num' }, p ? 'mem ' + num(p.memoryFullPct, 1) + '% · cpu ' + num(p.cpuSomePct, 1) + '%' : dash),
      el('td', {}, net ? el('span', { class: net.allowlist === 'ok' ? 'ok' : 'bad', title: net.detail || '' }, net.allowlist) : dash),
      el('td', {}, pools.length ? pools.map(([name, v]) => el('div', { class: 'small' }, el('code', {}, name), ' ' + v.ready + ' ready, ' + v.starting + ' starting')) : dash));
  });
  $('nodes').replaceChildren(rows.length ? table(['node', 'pool', 'state', 'sandboxes', 'CPU requested / capacity', 'memory requested / capacity', 'sandbox memory', 'PSI (avg10)', 'network self-test', 'warm pools here'], rows) : el('p', { class: 'muted' }, 'No worker host is heartbeating.'));
  $('pools').replaceChildren(s.pools.length ? table(['pool', 'ready / target', 'claims / min', 'misses / min', 'hosts'], s.pools.map((p) => el('tr', { 'data-pool': p.name },
    el('td', {}, el('code', {}, p.name)), el('td', { class: 'num', 'data-col': 'ready' }, p.status.ready + ' / ' + p.status.target),
    el('td', { class: 'num', 'data-col': 'claims' }, p.status.claimsPerMinute), el('td', { class: 'num', 'data-col': 'misses' }, p.status.missesPerMinute), el('td', { class: 'num' }, p.status.hosts.length)))) : el('p', { class: 'muted small' }, 'No warm pools.'));
}

function renderRecent(s) {
  $('recent').replaceChildren(s.recent.length ? table(['at', 'tenant', 'sandbox', 'state', 'node', 'labels'], s.recent.map((r) => el('tr', { 'data-sandbox-id': r.sandboxId || '' },
    el('td', { class: 'num' }, new Date(r.atMs).toLocaleTimeString()), el('td', {}, r.tenant), el('td', {}, r.sandboxId ? el('code', {}, r.sandboxId) : 'refused'),
    el('td', {}, r.state || dash), el('td', {}, r.node ? el('code', {}, r.node) : dash), el('td', { class: 'small' }, Object.entries(r.labels).map(([k, v]) => k + '=' + v).join('  ') || dash)))) : el('p', { class: 'muted small' }, 'No creates recorded.'));
}

function renderSignals(s) {
  const t = s.signals.total, pts = s.signals.points, from = s.signals.fromMs, to = s.signals.toMs;
  $('signals-note').textContent = 'Over the last ' + num((to - from) / 60000, 0) + ' min, in steps of ' + s.signals.stepSeconds + ' s; quantiles from log bins (within one bin, 26%).';
  $('signal-figures').replaceChildren(
    figure('createsPerSecond', 'creates admitted / s', t.createsPerSecond, num(t.createsPerSecond, 3)),
    figure('admitted', 'creates admitted', t.admitted, num(t.admitted, 0)),
    figure('waitP50Ms', 'environment wait p50', t.waitP50Ms, ms(t.waitP50Ms)), figure('waitP99Ms', 'environment wait p99', t.waitP99Ms, ms(t.waitP99Ms)),
    figure('execs', 'execs', t.execs, num(t.execs, 0)), figure('execP50Ms', 'exec time p50', t.execP50Ms, ms(t.execP50Ms)), figure('execP99Ms', 'exec time p99', t.execP99Ms, ms(t.execP99Ms)),
    figure('ended', 'sandboxes ended', t.ended, num(t.ended, 0)), figure('residenceMedianMs', 'residence median', t.residenceMedianMs, ms(t.residenceMedianMs)), figure('residenceMeanMs', 'residence mean', t.residenceMeanMs, ms(t.residenceMeanMs)),
    figure('tasksPerSecond', 'batch tasks ended / s', t.tasksPerSecond, num(t.tasksPerSecond, 3)), figure('taskSuccessShare', 'batch tasks succeeded', t.taskSuccessShare, pct(t.taskSuccessShare)),
    figure('refusals.quota', 'refused: quota', t.refusals.quota, num(t.refusals.quota, 0)), figure('refusals.no_capacity', 'refused: no capacity', t.refusals.no_capacity, num(t.refusals.no_capacity, 0)), figure('refusals.network', 'refused: network', t.refusals.network, num(t.refusals.network, 0)));
  const mid = (p) => p.startMs + p.seconds * 500;
  const line = (label, key, scale) => ({ label, points: pts.map((p) => ({ x: mid(p), y: p[key] === null ? null : p[key] * (scale || 1) })) });
  $('signal-charts').replaceChildren(
    lineChart('Creates admitted', 'per second', [line('creates / s', 'createsPerSecond'), line('batch tasks ended / s', 'tasksPerSecond')], from, to),
    lineChart('Environment-creation wait (request to running)', 'ms', [line('p50', 'waitP50Ms'), line('p99', 'waitP99Ms')], from, to),
    lineChart('Tool (exec) time', 'ms', [line('p50', 'execP50Ms'), line('p99', 'execP99Ms')], from, to),
    lineChart('Residence of ended sandboxes', 'seconds', [line('median', 'residenceMedianMs', 0.001), line('mean', 'residenceMeanMs', 0.001)], from, to),
    lineChart('Refused creates', 'per step', ['quota', 'no_capacity', 'network'].map((c) => ({ label: c.replace('_', ' '), points: pts.map((p) => ({ x: mid(p), y: p.refusals[c] })) })), from, to, { integer: true }),
    lineChart('Batch task success', 'share', [line('succeeded / ended', 'taskSuccessShare')], from, to),
    lineChart('Live sandboxes (peak per step)', 'sandboxes', [line('cluster', 'peakLive'), line('busiest node', 'peakPerNode')], from, to, { integer: true }));
}

const ROLLOUT_PARTS = [['modelUpstream', 'model upstream', '#4a7fd0'], ['modelHeld', 'model held', '#d64545'], ['tool', 'tool', '#2f9e5b'], ['envWait', 'environment wait', '#e0891b'], ['agent', 'agent', '#9aa1ab']];

/** One bar per job: its rollouts' summed time split by part (each part's share), the mean rollout and the completion rate beside it. */
function renderRolloutJobs(s) {
  const jobs = s.rolloutJobs;
  if (!jobs.length) { $('rollout-jobs').replaceChildren(el('p', { class: 'muted small' }, 'No hosted rollout has ended.')); return; }
  const legend = el('div', { class: 'legend' }, ROLLOUT_PARTS.map(([, label, color]) => el('span', {}, el('i', { style: { background: color } }), label)));
  const rows = jobs.map((j) => {
    const t = j.timesMs, total = t.total, ended = Object.values(j.ended).reduce((a, b) => a + b, 0);
    let x = 0;
    const parts = ROLLOUT_PARTS.map(([key, label, color]) => {
      const w = total > 0 ? (100 * t[key]) / total : 0;
      const rect = svg('rect', { 'data-part': key, 'data-ms': t[key], x: x.toFixed(3), y: 0, width: w.toFixed(3), height: 18, fill: color }, svg('title', {}, label + ': ' + pct(total > 0 ? t[key] / total : null)));
      x += w;
      return rect;
    });
    const shares = ROLLOUT_PARTS.filter(([key]) => t[key] > 0).map(([key, label]) => label + ' ' + pct(t[key] / total)).join(' · ');
    const notOk = Object.entries(j.ended).filter(([k, n]) => k !== 'succeeded' && n > 0).map(([k, n]) => n + ' ' + k.replace('_', ' ')).join(', ');
    return el('tr', { 'data-rollout-job': j.tenant + '/' + j.job, 'data-timed': j.timed, 'data-ended': ended },
      el('td', {}, el('code', {}, j.job), el('div', { class: 'muted small' }, j.tenant)),
      el('td', { class: 'bar' }, el('div', { class: 'bar' }, svg('svg', { viewBox: '0 0 100 18', preserveAspectRatio: 'none', role: 'img', 'aria-label': 'where ' + j.job + '\'s rollout time went' }, parts)), el('div', { class: 'muted small' }, shares || dash)),
      el('td', { class: 'num', 'data-col': 'mean' }, j.timed ? ms(total / j.timed) : dash, el('div', { class: 'muted small' }, j.timed + ' timed')),
      el('td', { class: 'num', 'data-col': 'completion', 'data-value': j.completionRate === null ? 'null' : String(j.completionRate) }, pct(j.completionRate), el('div', { class: 'muted small' }, j.ended.succeeded + ' of ' + ended + (notOk ? ' (' + notOk + ')' : ''))));
  });
  $('rollout-jobs').replaceChildren(legend, table(['job', 'where the time went', 'mean rollout', 'succeeded'], rows));
}

function renderBurst(s) {
  const b = s.burst;
  if (!b) { $('burst').replaceChildren(el('p', { class: 'muted' }, 'Cloud burst is not enabled on this gateway.')); return; }
  const at = (f) => Math.min(100, Math.max(0, 100 * f)).toFixed(1) + '%';
  $('burst').replaceChildren(
    el('div', { class: 'meter', 'data-figure': 'utilization', 'data-value': b.utilization, role: 'meter', 'aria-valuenow': b.utilization, 'aria-valuemin': 0, 'aria-valuemax': 1, 'aria-label': 'local utilization' },
      el('div', { class: 'fill', style: { width: at(b.utilization) } }),
      el('div', { class: 'mark divert', style: { left: at(b.policy.divertAboveUtilization) } }, el('span', {}, 'divert ' + pct(b.policy.divertAboveUtilization))),
      el('div', { class: 'mark stop', style: { left: at(b.policy.stopBelowUtilization) } }, el('span', {}, 'stop ' + pct(b.policy.stopBelowUtilization)))),
    el('div', { class: 'figures' },
      figure('utilization', 'local utilization (' + b.policy.utilizationBasis + ')', b.utilization, pct(b.utilization)),
      figure('diverting', 'diverting', b.diverting, b.diverting ? 'yes, since ' + new Date(b.divertingSinceMs).toLocaleTimeString() : 'no'),
      figure('diverted', 'diverted creates', b.counts.diverted, num(b.counts.diverted, 0)),
      figure('ineligible', 'ineligible (stayed local)', b.counts.ineligible, num(b.counts.ineligible, 0)),
      figure('cloudHosts', 'cloud hosts', b.cloudHosts.length, b.cloudHosts.length + ' (max ' + b.policy.maxCloudHosts + ')'),
      figure('vmHours', 'VM-hours so far', b.vmHours, num(b.vmHours, 3))),
    b.cloudHosts.length ? table(['cloud host', 'state', 'load', 'up'], b.cloudHosts.map((h) => el('tr', { 'data-cloud-host': h.id },
      el('td', {}, el('code', {}, h.id)), el('td', {}, h.state), el('td', { class: 'num' }, h.sandboxes + ' / ' + h.slots), el('td', { class: 'num' }, ms(s.atMs - h.provisionedAtMs))))) : el('p', { class: 'muted small' }, 'No cloud hosts.'));
}

function renderCapacity(s) {
  const c = s.capacity;
  $('capacity').replaceChildren(
    el('div', { class: 'figures' },
      figure('admissionRatePerSecond', 'λ admission rate / s', c.admissionRatePerSecond, num(c.admissionRatePerSecond, 3)),
      figure('meanResidenceSeconds', 'W mean residence', c.meanResidenceSeconds, c.meanResidenceSeconds === null ? dash : num(c.meanResidenceSeconds, 2) + ' s'),
      figure('estimatedConcurrency', 'L = λ × W', c.estimatedConcurrency, num(c.estimatedConcurrency, 2)),
      figure('liveSandboxes', 'live now (pools apart)', c.liveSandboxes, num(c.liveSandboxes, 0)),
      figure('residentPool', 'warm pool residents', c.residentPool, num(c.residentPool, 0)),
      figure('safePerNode', 'safe per node (' + c.safePerNode.source.replace('_', ' ') + ')', c.safePerNode.sandboxes, num(c.safePerNode.sandboxes, 1)),
      figure('nodesNeeded', 'nodes needed (headroom ×' + c.headroom + ')', c.nodesNeeded, num(c.nodesNeeded, 0) + ' (' + c.nodes + ' now)')),
    table(['nodes', 'safe sandboxes', 'utilization', 'headroom'], c.scenarios.map((sc) => el('tr', { 'data-scenario-nodes': sc.nodes },
      el('td', {}, sc.nodes + (sc.nodes === c.nodes ? ' (now)' : sc.nodes < c.nodes ? ' (one fewer)' : ' (one more)')), el('td', { class: 'num' }, num(sc.safeSandboxes, 1)),
      el('td', { class: 'num' }, pct(sc.utilization)), el('td', { class: sc.meetsHeadroom === false ? 'bad' : 'ok' }, sc.meetsHeadroom === null ? dash : sc.meetsHeadroom ? 'kept' : 'short')))),
    el('p', { class: 'explain', id: 'capacity-explanation' }, c.explanation));
}

function query() {
  const q = new URLSearchParams({ windowSeconds: $('window').value, capacityWindowSeconds: $('cap-window').value || '300' });
  if ($('cap-safe').value) q.set('safePerNode', $('cap-safe').value);
  if ($('cap-headroom').value) q.set('headroom', $('cap-headroom').value);
  return q.toString();
}

async function refresh() {
  if (busy) return;
  busy = true;
  clearTimeout(timer);
  let stop = false;
  try {
    if (!token) { setStatus('Enter a token with scope cluster:read.'); stop = true; return; }
    const s = await (await call('GET', '/v1/cluster/console?' + query())).json();
    renderNodes(s); renderRecent(s); renderSignals(s); renderRolloutJobs(s); renderBurst(s); renderCapacity(s);
    document.body.setAttribute('data-at-ms', String(s.atMs));
    setStatus('Updated ' + new Date(s.atMs).toLocaleTimeString());
  } catch (e) {
    setStatus(e.message, true);
    stop = e.status === 401 || e.status === 403;
  } finally {
    busy = false;
    if (!stop) timer = setTimeout(refresh, POLL_MS);
  }
}

async function runSimulation() {
  $('sim-run').disabled = true;
  $('sim').replaceChildren(el('p', { class: 'muted small' }, 'Simulating…'));
  try {
    const r = await (await call('POST', '/v1/burst/simulation', { traceMinutes: Number($('sim-minutes').value) || 20, seed: Number($('sim-seed').value) || 1 })).json();
    const res = r.result;
    $('sim').replaceChildren(
      el('div', { class: 'figures', id: 'sim-figures' },
        figure('sim.creates', 'creates replayed', r.trace.creates, num(r.trace.creates, 0)),
        figure('sim.queueWaitP99Ms', 'queue wait p99', res.queueWaitP99Ms, ms(res.queueWaitP99Ms)),
        figure('sim.diverted', 'diverted', res.diverted, num(res.diverted, 0)),
        figure('sim.cloudVmHours', 'cloud VM-hours', res.cloudVmHours, num(res.cloudVmHours, 2)),
        figure('sim.refused', 'refused', res.refused, num(res.refused, 0)),
        figure('sim.elapsedMs', 'simulated in', r.elapsedMs, ms(r.elapsedMs))),
      el('img', { class: 'sim', id: 'sim-chart', alt: 'burst sweep: queue wait p99, VM-hours and overflow share against the threshold', src: 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(r.sweepSvg) }));
  } catch (e) {
    $('sim').replaceChildren(el('p', { class: 'bad' }, e.message));
  } finally {
    $('sim-run').disabled = false;
  }
}

$('auth').addEventListener('submit', (e) => { e.preventDefault(); token = $('token').value.trim(); sessionStorage.setItem('rollbox.token', token); void refresh(); });
$('forget').addEventListener('click', () => { token = ''; $('token').value = ''; sessionStorage.removeItem('rollbox.token'); setStatus('Token forgotten.'); });
$('window').addEventListener('change', () => void refresh());
$('capacity-form').addEventListener('submit', (e) => { e.preventDefault(); void refresh(); });
$('sim-form').addEventListener('submit', (e) => { e.preventDefault(); void runSimulation(); });
$('token').value = token;
void refresh();
`;

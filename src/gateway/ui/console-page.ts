/**
 * The operator console (GET /ui/console): one self-contained document like the batch
 * page (inline CSS and vanilla JS, nothing fetched but the /v1 API), polling
 * /v1/cluster/console. Everything from the API reaches the DOM as text (textContent,
 * text nodes, SVG text nodes), never as markup; the simulator's SVG chart is shown as an
 * image, where nothing in it runs. Script and style are separate strings so the server
 * names them by hash in its Content-Security-Policy.
 */
export { CONSOLE_SCRIPT } from './console-script.ts';

export const CONSOLE_STYLE = String.raw`
:root { --line: #e3e5e8; --muted: #6b7280; --bg: #f7f8fa; --bad: #d64545; --ok: #2f9e5b; --warn: #e0891b;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); }
header { display: flex; gap: 14px; align-items: center; padding: 10px 20px; background: #fff; border-bottom: 1px solid var(--line); flex-wrap: wrap; position: sticky; top: 0; z-index: 1; }
h1 { font-size: 17px; margin: 0 10px 0 0; } h2 { font-size: 15px; margin: 0 0 8px; } h3 { font-size: 13px; margin: 12px 0 4px; color: #374151; }
form { display: flex; gap: 6px; align-items: center; flex-wrap: wrap; } input, select { padding: 4px 7px; border: 1px solid #c9ccd1; border-radius: 5px; font: inherit; }
input#token { width: 280px; } input.small { width: 80px; }
button { padding: 4px 11px; border: 1px solid #c9ccd1; border-radius: 5px; background: #fff; font: inherit; cursor: pointer; } button:hover { background: #f0f1f3; }
#status { color: var(--muted); font-size: 12px; margin-left: auto; } #status.error { color: var(--bad); }
main { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 16px; padding: 16px 20px; }
@media (max-width: 1100px) { main { grid-template-columns: 1fr; } }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; min-width: 0; }
section.wide { grid-column: 1 / -1; }
table { width: 100%; border-collapse: collapse; font-size: 12.5px; } th { text-align: left; color: var(--muted); font-weight: 500; white-space: nowrap; }
th, td { padding: 3px 6px; border-bottom: 1px solid var(--line); vertical-align: top; } td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; word-break: break-all; }
.muted { color: var(--muted); } .small { font-size: 12px; } .bad { color: var(--bad); } .ok { color: var(--ok); }
.tag { font-size: 11px; padding: 0 6px; border-radius: 8px; background: #e8eaed; margin-left: 4px; white-space: nowrap; } .tag.cloud { background: #dbe8fa; color: #1d4f91; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 8px; margin: 6px 0 10px; }
.figure { border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; } .figure .k { color: var(--muted); font-size: 11.5px; } .figure .v { font-size: 17px; font-variant-numeric: tabular-nums; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr)); gap: 12px; }
.chart svg { width: 100%; height: auto; display: block; } .chart .title { font-size: 12.5px; font-weight: 600; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 12px; font-size: 11.5px; color: #374151; } .legend i { display: inline-block; width: 10px; height: 3px; margin-right: 4px; vertical-align: middle; }
.axis { font-size: 10px; fill: #6b7280; } .grid { stroke: #eceef1; } .frame { stroke: #c9ccd1; fill: none; }
.meter { position: relative; height: 14px; background: #eceef1; border-radius: 7px; margin: 16px 0 20px; }
.meter .fill { height: 100%; border-radius: 7px; background: #4a7fd0; } .meter .mark { position: absolute; top: -5px; bottom: -5px; width: 2px; }
.meter .mark span { position: absolute; top: 19px; left: -30px; width: 60px; text-align: center; font-size: 10.5px; color: var(--muted); }
.meter .mark.divert { background: var(--bad); } .meter .mark.stop { background: var(--warn); }
/* stop is always below divert: its label reads leftwards, divert's rightwards, so the two never meet. */
.meter .mark.stop span { left: -62px; text-align: right; } .meter .mark.divert span { left: 2px; text-align: left; }
p.explain { font-size: 12.5px; background: #f6f7f9; padding: 6px 8px; border-radius: 5px; margin: 8px 0; }
.bar svg { width: 100%; height: 18px; display: block; } td.bar { width: 55%; min-width: 200px; }
img.sim { width: 100%; border: 1px solid var(--line); border-radius: 6px; margin-top: 8px; }
`;

export const CONSOLE_BODY = `
<header>
  <h1>rollbox console</h1>
  <form id="auth" autocomplete="off">
    <input id="token" type="password" placeholder="Bearer token (scope cluster:read or admin)" aria-label="token">
    <button type="submit">Use token</button><button type="button" id="forget">Forget</button>
  </form>
  <label class="small">charts over <select id="window" aria-label="chart window">
    <option value="900">15 min</option><option value="3600">1 h</option><option value="10800">3 h</option></select></label>
  <span id="status" role="status"></span>
</header>
<main>
  <section class="wide" id="nodes-section"><h2>Nodes</h2><div id="nodes"></div><h3>Warm pools</h3><div id="pools"></div><h3>Latest creates</h3><div id="recent"></div></section>
  <section class="wide" id="signals-section"><h2>Signals</h2><p class="muted small" id="signals-note"></p><div class="figures" id="signal-figures"></div><div class="charts" id="signal-charts"></div></section>
  <section class="wide" id="rollouts-section"><h2>Where hosted rollouts' time goes, per job</h2><p class="muted small">Each bar is a job's ended rollouts' wall time (task sandbox create requested to agent exit), split by what it waited on; the mean rollout's length and the share that succeeded beside it.</p><div id="rollout-jobs"></div></section>
  <section id="burst-section"><h2>Burst</h2><div id="burst"></div></section>
  <section id="capacity-section"><h2>Capacity (Little's law)</h2>
    <form id="capacity-form" autocomplete="off">
      <label class="small">stable window, s <input class="small" id="cap-window" type="number" min="10" max="10800" value="300"></label>
      <label class="small">safe per node <input class="small" id="cap-safe" type="number" min="1" placeholder="observed"></label>
      <label class="small">headroom x <input class="small" id="cap-headroom" type="number" min="1" max="10" step="0.05" placeholder="default"></label>
      <button type="submit">Apply</button>
    </form>
    <div id="capacity"></div></section>
  <section class="wide" id="sim-section"><h2>Burst simulator and sweep</h2>
    <form id="sim-form" autocomplete="off">
      <label class="small">trace minutes <input class="small" id="sim-minutes" type="number" min="1" max="120" value="20"></label>
      <label class="small">seed <input class="small" id="sim-seed" type="number" value="1"></label>
      <button type="submit" id="sim-run">Run with the current policy</button>
    </form>
    <div id="sim"></div></section>
</main>`;

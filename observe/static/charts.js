// The charts: the history from /api/history (sampled by the metrics actor every 10 s, an
// hour kept), then /api/totals every 2 s; counters become rates between samples. Drawn by
// uPlot (vendored in /static/vendor, see its README there) with a time axis in the reader's
// zone (from 5 minutes to an hour wide, as old as the history) and a labelled value axis.
// Nothing from the internet.
const WINDOW = 3600;  // seconds kept and shown at most
const MIN_WINDOW = 300;  // seconds shown at least (a young broker's history fills the width)
const LIVE_EVERY = 2000;  // ms between live samples
const COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"];
let samples = [], span = MIN_WINDOW, now = Date.now() / 1000;
const charts = {};  // id -> {plot, names}

function human(v) {
  const a = Math.abs(v);
  for (const [d, u] of [[1e9, "G"], [1e6, "M"], [1e3, "k"]]) if (a >= d) return (v / d).toFixed(a >= 10 * d ? 0 : 1) + u;
  return a >= 10 || v === 0 ? v.toFixed(0) : v.toPrecision(2);
}

function clock(t) {
  const d = new Date(t * 1000), pad = (n) => String(n).padStart(2, "0");
  return pad(d.getHours()) + ":" + pad(d.getMinutes());
}

// A chart in the element `id` of the series `names` (x: seconds since the epoch). The ticks
// each axis drew and the points plotted are left on the element (data-x-ticks, data-y-ticks,
// data-points, data-since) for the tests and for anyone reading the page's source.
function chart(id, names) {
  const el = document.getElementById(id), ticks = {x: [], y: []};
  const every = () => [60, 120, 300, 600].find((e) => span / e <= 8) || 600;  // a line every 1 to 10 minutes
  const opts = {
    width: 960, height: 240,
    series: [{}, ...names.map((n, i) => ({label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
                                           value: (u, v) => (v == null ? "-" : human(v))}))],
    scales: {x: {time: true, range: () => [now - span, now]},
             y: {range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1]}},
    axes: [
      {space: 60, incrs: [60, 120, 300, 600, 1200],
       splits: (u, i, min, max) => { const e = every(), out = [];
                                     for (let t = Math.ceil(min / e) * e; t <= max; t += e) out.push(t); return out; },
       values: (u, splits) => (ticks.x = splits.map(clock))},
      {size: 56, values: (u, splits) => (ticks.y = splits.map(human))},
    ],
    hooks: {draw: [(u) => {
      el.dataset.xTicks = ticks.x.join(" "); el.dataset.yTicks = ticks.y.join(" ");
      let points = 0;
      for (let s = 1; s < u.data.length; s++) points += u.data[s].filter((v, k) => v != null && u.data[0][k] >= now - span).length;
      el.dataset.points = points; el.dataset.since = samples.length ? samples[0].time : "";
    }]},
  };
  return {plot: new uPlot(opts, [[], ...names.map(() => [])], el), names};
}

// [xs, ys...]: the rate of each counter key between consecutive samples
function rates(keys) {
  const data = [[], ...keys.map(() => [])];
  for (let i = 1; i < samples.length; i++) {
    const dt = samples[i].time - samples[i - 1].time;
    if (dt <= 0) continue;
    data[0].push(samples[i].time);
    keys.forEach((k, j) => data[j + 1].push(Math.max(0, samples[i][k] - samples[i - 1][k]) / dt));
  }
  return data;
}

function show(id, names, data) {
  let c = charts[id];
  if (!c || c.names.join("\n") !== names.join("\n")) {  // new series (a group appeared): a new chart
    if (c) c.plot.destroy();
    c = charts[id] = chart(id, names);
  }
  c.plot.setData(data);
}

function render() {
  now = Date.now() / 1000;
  samples = samples.filter((s) => s.time >= now - WINDOW);
  span = Math.min(WINDOW, Math.max(MIN_WINDOW, samples.length ? now - samples[0].time : 0));
  show("throughput", ["bytes in", "bytes out"], rates(["bytes_in", "bytes_out"]));
  show("records", ["records in", "records out"], rates(["records_in", "records_out"]));
  const groups = [...new Set(samples.flatMap((s) => Object.keys(s.lag)))].sort();
  show("lag", groups, [samples.map((s) => s.time), ...groups.map((g) => samples.map((s) => s.lag[g] || 0))]);
}

async function tick() {
  try {
    const r = await fetch("/api/totals");
    samples.push(await r.json());
    render();
  } catch (e) { /* broker restarting: try again next tick */ }
}

async function start() {
  try {
    const r = await fetch("/api/history");
    samples = (await r.json()).samples || [];
  } catch (e) { samples = []; }
  await tick();
  setInterval(tick, LIVE_EVERY);
}
start();

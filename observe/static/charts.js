// The charts: the history from /api/history (sampled by the metrics actor every 10 s, an
// hour kept), then /api/totals every 2 s; counters become rates between samples. Drawn on
// canvases with a time axis (local time; from 5 minutes to an hour wide, as old as the
// history) and a value axis. No library, nothing from the internet.
const WINDOW = 3600;  // seconds kept and shown at most
const MIN_WINDOW = 300;  // seconds shown at least (a young broker's history fills the width)
const LIVE_EVERY = 2000;  // ms between live samples
const COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"];
const PAD = {left: 64, right: 12, top: 22, bottom: 26};
let samples = [];

function human(v) {
  const a = Math.abs(v);
  for (const [d, u] of [[1e9, "G"], [1e6, "M"], [1e3, "k"]]) if (a >= d) return (v / d).toFixed(a >= 10 * d ? 0 : 1) + u;
  return a >= 10 || v === 0 ? v.toFixed(0) : v.toPrecision(2);
}

function niceStep(max, n) {  // a round step giving about n ticks up to max
  const raw = max / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

function clock(t) {
  const d = new Date(t * 1000), pad = (n) => String(n).padStart(2, "0");
  return pad(d.getHours()) + ":" + pad(d.getMinutes());
}

// series: {name: [[time, value], ...]}; the x axis spans the last `span` seconds to now
function draw(id, series, now, span) {
  const c = document.getElementById(id), g = c.getContext("2d");
  const w = c.width - PAD.left - PAD.right, h = c.height - PAD.top - PAD.bottom;
  g.clearRect(0, 0, c.width, c.height);
  const names = Object.keys(series);
  let max = 0;
  for (const n of names) for (const [, v] of series[n]) max = Math.max(max, v);
  const step = niceStep(max > 0 ? max : 1, 4), top = Math.max(step, Math.ceil(max / step) * step);
  const t0 = now - span, x = (t) => PAD.left + ((t - t0) / span) * w, y = (v) => PAD.top + h - (v / top) * h;
  g.font = "11px sans-serif"; g.strokeStyle = "#ddd"; g.fillStyle = "#555"; g.lineWidth = 1;
  const yTicks = [], xTicks = [];
  for (let v = 0; v <= top + step / 2; v += step) {  // value axis: grid lines and labels
    g.beginPath(); g.moveTo(PAD.left, y(v)); g.lineTo(PAD.left + w, y(v)); g.stroke();
    g.textAlign = "right"; g.fillText(human(v), PAD.left - 6, y(v) + 4); yTicks.push(human(v));
  }
  const every = [60, 120, 300, 600].find((e) => span / e <= 8) || 600;  // time axis, local time
  for (let t = Math.ceil(t0 / every) * every; t <= now; t += every) {
    g.beginPath(); g.moveTo(x(t), PAD.top); g.lineTo(x(t), PAD.top + h); g.stroke();
    g.textAlign = "center"; g.fillText(clock(t), x(t), PAD.top + h + 16); xTicks.push(clock(t));
  }
  g.strokeStyle = "#888"; g.strokeRect(PAD.left, PAD.top, w, h);
  let points = 0;
  names.forEach((n, i) => {
    const pts = series[n].filter(([t]) => t >= t0);
    g.strokeStyle = g.fillStyle = COLORS[i % COLORS.length]; g.lineWidth = 1.5; g.beginPath();
    pts.forEach(([t, v], k) => (k ? g.lineTo(x(t), y(v)) : g.moveTo(x(t), y(v))));
    g.stroke(); g.textAlign = "left"; g.fillText(n, PAD.left + 8 + i * 150, 14);
    points += pts.length;
  });
  c.dataset.xTicks = xTicks.join(" "); c.dataset.yTicks = yTicks.join(" ");
  c.dataset.points = points; c.dataset.since = samples.length ? samples[0].time : "";
}

function rates(key) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = samples[i].time - samples[i - 1].time;
    if (dt > 0) out.push([samples[i].time, Math.max(0, samples[i][key] - samples[i - 1][key]) / dt]);
  }
  return out;
}

function render() {
  const now = Date.now() / 1000;
  samples = samples.filter((s) => s.time >= now - WINDOW);
  const span = Math.min(WINDOW, Math.max(MIN_WINDOW, samples.length ? now - samples[0].time : 0));
  draw("throughput", {"bytes in": rates("bytes_in"), "bytes out": rates("bytes_out")}, now, span);
  draw("records", {"records in": rates("records_in"), "records out": rates("records_out")}, now, span);
  const lag = {};
  for (const s of samples) for (const g of Object.keys(s.lag)) lag[g] = [];
  for (const s of samples) for (const g of Object.keys(lag)) lag[g].push([s.time, s.lag[g] || 0]);
  draw("lag", lag, now, span);
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

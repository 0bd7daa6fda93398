// Live charts: poll /api/totals every 2 s, turn counters into rates, draw on canvases.
// No library, nothing from the internet.
const samples = [];
const KEEP = 150;  // 5 minutes at 2 s
const COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"];

function draw(id, series) {
  const c = document.getElementById(id), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const names = Object.keys(series);
  let max = 1;
  for (const n of names) for (const v of series[n]) max = Math.max(max, v);
  g.fillStyle = "#666"; g.font = "12px sans-serif"; g.fillText(max.toPrecision(3), 4, 12);
  names.forEach((n, i) => {
    const ys = series[n];
    g.strokeStyle = COLORS[i % COLORS.length]; g.beginPath();
    ys.forEach((v, x) => {
      const px = (x / Math.max(ys.length - 1, 1)) * c.width, py = c.height - 4 - (v / max) * (c.height - 20);
      x ? g.lineTo(px, py) : g.moveTo(px, py);
    });
    g.stroke(); g.fillStyle = g.strokeStyle; g.fillText(n, 60 + i * 140, 12);
  });
}

function rate(key) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = samples[i].time - samples[i - 1].time;
    out.push(dt > 0 ? Math.max(0, samples[i][key] - samples[i - 1][key]) / dt : 0);
  }
  return out;
}

async function tick() {
  try {
    const r = await fetch("/api/totals");
    samples.push(await r.json());
    if (samples.length > KEEP) samples.shift();
    draw("throughput", {"bytes in": rate("bytes_in"), "bytes out": rate("bytes_out")});
    draw("records", {"records in": rate("records_in"), "records out": rate("records_out")});
    const lag = {};
    for (const s of samples) for (const g of Object.keys(s.lag)) lag[g] = [];
    for (const s of samples) for (const g of Object.keys(lag)) lag[g].push(s.lag[g] || 0);
    draw("lag", lag);
  } catch (e) { /* broker restarting: try again next tick */ }
}
tick(); setInterval(tick, 2000);

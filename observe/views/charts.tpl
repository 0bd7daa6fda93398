% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<link rel="stylesheet" href="/static/vendor/uPlot.min.css">
<p>The last hour of this broker's numbers: sampled by the broker every 10 s (so the past is
there when the page opens), then every 2 s while it is open. Times are local. Drawn by
<a href="/static/vendor/README.md">uPlot 1.6.32</a> (MIT), served from this broker.</p>
<h2>Throughput (bytes/s)</h2><div id="throughput" class="chart"></div>
<h2>Records in / out (records/s)</h2><div id="records" class="chart"></div>
<h2>Consumer lag (records)</h2><div id="lag" class="chart"></div>
<script src="/static/vendor/uPlot.iife.min.js"></script>
<script src="/static/charts.js"></script>

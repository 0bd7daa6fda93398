% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p>The last hour of this broker's numbers: sampled by the broker every 10 s (so the past is
there when the page opens), then every 2 s while it is open. Times are local.</p>
<h2>Throughput (bytes/s)</h2><canvas id="throughput" width="960" height="240"></canvas>
<h2>Records in / out (records/s)</h2><canvas id="records" width="960" height="240"></canvas>
<h2>Consumer lag (records)</h2><canvas id="lag" width="960" height="240"></canvas>
<script src="/static/charts.js"></script>

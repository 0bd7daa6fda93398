% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p>Rates over the last minutes, sampled every 2 s from this broker's metrics.</p>
<h2>Throughput (bytes/s)</h2><canvas id="throughput" width="900" height="220"></canvas>
<h2>Records in / out (records/s)</h2><canvas id="records" width="900" height="220"></canvas>
<h2>Consumer lag (records)</h2><canvas id="lag" width="900" height="220"></canvas>
<script src="/static/charts.js"></script>

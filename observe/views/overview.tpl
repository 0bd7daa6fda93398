% rebase("layout.tpl", title=title, user=user, csrf=csrf)
% sup = status["supervisor"]
<table class="kv">
<tr><th>Broker</th><td>{{sup.get("broker_id")}}</td></tr>
<tr><th>Cluster</th><td>{{sup.get("cluster_id")}}</td></tr>
<tr><th>Kafka listener</th><td>{{sup.get("address") or "starting"}}</td></tr>
<tr><th>Supervisor</th><td>pid {{sup.get("pid")}}, {{sup.get("state")}}</td></tr>
<tr><th>Data</th><td>{{sup.get("data_dir")}}</td></tr>
</table>
<h2>Actors</h2>
<table id="actors"><tr><th>actor</th><th>role</th><th>pid</th><th>state</th><th>restarts</th>
<th>RSS MiB</th><th>CPU %</th><th>messages</th><th>open</th><th>uptime s</th></tr>
% for a in status["actors"]:
<tr><td>{{a["name"]}}</td><td>{{a["role"]}}</td><td>{{a["pid"]}}</td><td class="{{a["state"]}}">{{a["state"]}}</td>
<td>{{a["restarts"]}}</td><td>{{"%.1f" % (a["rss"] / 2**20) if a.get("rss") else "-"}}</td>
<td>{{"%.0f" % a["cpu"] if a.get("cpu") is not None else "-"}}</td><td>{{a.get("processed") or 0}}</td>
<td>{{a.get("open") or 0}}</td><td>{{a.get("uptime")}}</td></tr>
% end
</table>

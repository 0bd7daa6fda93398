% rebase("layout.tpl", title=title, user=user, csrf=csrf)
% if message:
<p class="message">{{message}}</p>
% end
<p><a href="/topics/{{topic.name}}/messages">Browse messages</a></p>
<h2>Partitions</h2>
<table id="partitions"><tr><th>partition</th><th>leader</th><th>replicas</th><th>ISR</th>
<th>start</th><th>high watermark</th><th>end</th><th>size</th><th>segments</th></tr>
% for p in topic.partitions:
% g = sizes.get(p.partition, {})
<tr><td><a href="/topics/{{topic.name}}/messages?partition={{p.partition}}">{{p.partition}}</a></td>
<td>{{p.leader}}</td><td>{{", ".join(map(str, p.replicas))}}</td><td>{{", ".join(map(str, p.isr))}}</td>
<td>{{g.get("log_start_offset", "-")}}</td><td>{{g.get("high_watermark", "-")}}</td><td>{{g.get("log_end_offset", "-")}}</td>
<td>{{g.get("log_size", "-")}}</td><td>{{g.get("log_segments", "-")}}</td></tr>
% end
</table>
<h2>Configs</h2>
<table id="configs"><tr><th>name</th><th>value</th><th>source</th></tr>
% for c in configs:
<tr class="{{"overridden" if c.source == "topic" else ""}}"><td>{{c.name}}</td><td>{{c.value}}</td>
<td>{{"set on this topic" if c.source == "topic" else c.source}}</td></tr>
% end
</table>
<form method="post" action="/topics/{{topic.name}}/configs" class="inline">
<input type="hidden" name="csrf" value="{{csrf}}">
<input name="key" placeholder="config, e.g. retention.ms" required><input name="value" placeholder="value">
<button type="submit">Set</button></form>

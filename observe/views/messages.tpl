% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<form method="get" class="inline" id="browse">
partition <select name="partition">
% for i in range(partitions):
<option value="{{i}}" {{"selected" if i == partition else ""}}>{{i}}</option>
% end
</select>
<input name="offset" value="{{offset}}" placeholder="from offset (default: start)">
<input name="timestamp" value="{{timestamp}}" placeholder="or from timestamp (ms)">
<input name="key" value="{{key}}" placeholder="key contains">
<select name="format">
% for f in ("text", "json", "hex"):
<option {{"selected" if f == fmt else ""}}>{{f}}</option>
% end
</select><button type="submit">Show</button></form>
% if error:
<p class="message">{{error}}</p>
% end
<table id="records"><tr><th>offset</th><th>timestamp</th><th>key</th><th>value</th><th>headers</th></tr>
% for r in records:
<tr><td>{{r.offset}}</td><td>{{r.timestamp}}</td><td><pre>{{render(r.key, fmt)}}</pre></td>
<td><pre>{{render(r.value, fmt)}}</pre></td><td>{{", ".join(k for k, _ in r.headers)}}</td></tr>
% end
</table>
<p>{{len(records)}} record(s) shown.</p>

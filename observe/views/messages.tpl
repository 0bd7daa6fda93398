% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<form method="get" class="inline" id="browse">
partition <select name="partition">
<option value="all" {{"selected" if partition == "all" else ""}}>all</option>
% for i in range(partitions):
<option value="{{i}}" {{"selected" if str(i) == partition else ""}}>{{i}}</option>
% end
</select>
<select name="order">
<option value="newest" {{"selected" if newest else ""}}>newest first</option>
<option value="oldest" {{"" if newest else "selected"}}>oldest first</option>
</select>
<input name="offset" value="{{offset}}" placeholder="from offset">
<input name="timestamp" value="{{timestamp}}" placeholder="or from timestamp (ms)">
<input name="key" value="{{key}}" placeholder="key contains">
<input name="value" value="{{value}}" placeholder="value contains">
<select name="format">
% for f in ("text", "json", "hex"):
<option {{"selected" if f == fmt else ""}}>{{f}}</option>
% end
</select><button type="submit">Show</button></form>
% if message:
<p class="message" id="produced">{{message}}</p>
% end
% if not internal:
<details id="produce"><summary>Produce a record</summary>
<form method="post" action="/topics/{{topic}}/produce" class="inline">
<input type="hidden" name="csrf" value="{{csrf}}">
<select name="partition"><option value="">any partition</option>
% for i in range(partitions):
<option value="{{i}}">{{i}}</option>
% end
</select>
<input name="key" placeholder="key (none if empty)">
<textarea name="value" rows="2" cols="50" placeholder="value"></textarea>
<button type="submit">Produce</button></form></details>
% end
% if error:
<p class="message">{{error}}</p>
% end
<table id="records"><tr><th>partition</th><th>offset</th><th>timestamp</th><th>key</th><th>value</th><th>headers</th></tr>
% for r in records:
<tr><td>{{r.partition}}</td><td>{{r.offset}}</td>
<td><time data-ms="{{r.timestamp}}" class="ts">{{when(r.timestamp)}}</time></td><td><pre>{{render(r.key, fmt)}}</pre></td>
<td><pre>{{render(r.value, fmt)}}</pre></td><td>{{", ".join(k for k, _ in r.headers)}}</td></tr>
% end
</table>
<p id="pager">{{len(records)}} record(s) shown.
<a href="{{first_url}}" id="first-page">{{"newest" if newest else "oldest"}}</a>
% if next_url:
<a href="{{next_url}}" id="next-page">{{"older" if newest else "newer"}} &rarr;</a>
% end
</p>
<script src="/static/time.js"></script>

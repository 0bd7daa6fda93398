% rebase("layout.tpl", title=title, user=user, csrf=csrf)
% if message:
<p class="message">{{message}}</p>
% end
<form method="post" action="/topics" id="create-topic" class="inline">
<input type="hidden" name="csrf" value="{{csrf}}">
<input name="name" placeholder="new topic name" required>
<input name="partitions" type="number" min="1" value="1" title="partitions">
<input name="replication_factor" type="number" min="1" value="1" title="replication factor">
<button type="submit">Create topic</button></form>
<form method="get" action="/topics" id="search-topics" class="inline search">
<input name="q" value="{{search}}" placeholder="search topics" type="search">
<label><input type="checkbox" name="internal" value="1" {{"checked" if internal else ""}}> internal topics</label>
<button type="submit">Search</button></form>
% if hidden:
<p class="hint" id="hidden-internal">{{hidden}} internal topic{{"s" if hidden != 1 else ""}} hidden
(<a href="{{show_internal}}">show</a>).</p>
% end
<table id="topics"><tr><th>topic</th><th>partitions</th><th>replicas</th><th class="num">size</th>
<th class="num">records</th><th>internal</th><th></th></tr>
% for t in topics:
<tr><td><a href="/topics/{{t.name}}">{{t.name}}</a></td><td>{{t.partitions}}</td><td>{{t.replicas}}</td>
<td class="num size" title="{{t.size if t.size is not None else ''}} bytes on this broker">{{size(t.size)}}</td>
<td class="num records">{{t.records if t.records is not None else "-"}}</td><td>{{"yes" if t.internal else ""}}</td>
<td>
% if t.internal:
<span class="hint">kept by the broker</span>
% else:
<form method="post" action="/topics/{{t.name}}/delete" class="inline delete">
<input type="hidden" name="csrf" value="{{csrf}}">
<input name="confirm" placeholder="type {{t.name}} to delete"><button type="submit">Delete</button></form>
% end
</td></tr>
% end
</table>
% if not topics:
<p class="hint">No topic{{" matches " + repr(search) if search else ""}}.</p>
% end

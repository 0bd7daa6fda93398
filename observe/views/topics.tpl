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
<table id="topics"><tr><th>topic</th><th>partitions</th><th>replicas</th><th>internal</th><th></th></tr>
% for t in topics:
<tr><td><a href="/topics/{{t.name}}">{{t.name}}</a></td><td>{{len(t.partitions)}}</td>
<td>{{len(t.partitions[0].replicas) if t.partitions else 0}}</td><td>{{"yes" if t.is_internal else ""}}</td>
<td><form method="post" action="/topics/{{t.name}}/delete" class="inline delete">
<input type="hidden" name="csrf" value="{{csrf}}">
<input name="confirm" placeholder="type {{t.name}} to delete"><button type="submit">Delete</button></form></td></tr>
% end
</table>

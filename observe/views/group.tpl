% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p>State: <b>{{group.get("group_state")}}</b>, epoch {{group.get("group_epoch")}},
assignor {{group.get("assignor_name", "")}}</p>
<h2>Members</h2>
<table id="members"><tr><th>member</th><th>client</th><th>host</th><th>subscribed</th></tr>
% for m in group.get("members", []):
<tr><td>{{m.get("member_id")}}</td><td>{{m.get("client_id")}}</td><td>{{m.get("client_host")}}</td>
<td>{{", ".join(m.get("subscribed_topic_names") or [])}}</td></tr>
% end
</table>
<h2>Partitions</h2>
<table id="lag"><tr><th>topic</th><th>partition</th><th>committed</th><th>log end</th><th>lag</th><th>owner</th></tr>
% for r in group["partitions"]:
<tr><td>{{r["topic"]}}</td><td>{{r["partition"]}}</td><td>{{r["committed"] if r["committed"] is not None else "-"}}</td>
<td>{{r["log_end"] if r["log_end"] is not None else "-"}}</td><td class="lag">{{r["lag"] if r["lag"] is not None else "-"}}</td>
<td>{{r["member_id"] or "-"}}</td></tr>
% end
</table>
% if message:
<p class="message" id="group-message">{{message}}</p>
% end
% if preview:
<h2>Dry run</h2>
<table id="preview"><tr><th>topic</th><th>partition</th><th class="num">committed now</th><th class="num">new</th></tr>
% for topic, partition, old, new in preview:
<tr><td>{{topic}}</td><td>{{partition}}</td><td class="num">{{old if old is not None else "-"}}</td><td class="num">{{new}}</td></tr>
% end
</table>
<form method="post" action="/groups/{{group["group_id"]}}/reset" id="apply-reset" class="inline">
<input type="hidden" name="csrf" value="{{csrf}}"><input type="hidden" name="execute" value="1">
<input type="hidden" name="topic" value="{{form.get("topic", "")}}"><input type="hidden" name="partition" value="{{form.get("partition", "")}}">
<input type="hidden" name="to" value="{{form.get("to", "")}}">
<input type="hidden" name="value" value="{{form.get("value", "")}}"><button type="submit">Apply</button></form>
% end
<h2>Reset offsets</h2>
<p class="hint">Only while the group has no members (stop its consumers first). Shows a dry run before anything is committed.
To an offset: the same offset on every chosen partition (one partition, or all of the topic), kept inside each log's range as <code>kafka-consumer-groups --to-offset</code> keeps it.</p>
<form method="post" action="/groups/{{group["group_id"]}}/reset" id="reset" class="inline">
<input type="hidden" name="csrf" value="{{csrf}}">
<select name="topic"><option value="">every topic it committed</option>
% for t in topics:
<option {{"selected" if form.get("topic") == t else ""}}>{{t}}</option>
% end
</select>
<input name="partition" value="{{form.get("partition", "")}}" placeholder="partition (all)" size="10" title="one partition of the chosen topic; empty: every partition">
to <select name="to">
% for choice in ("earliest", "latest", "timestamp", "shift", "offset"):
<option {{"selected" if form.get("to") == choice else ""}}>{{choice}}</option>
% end
</select>
<input name="value" value="{{form.get("value", "")}}" placeholder="timestamp (ms), shift (+/-N) or offset">
<button type="submit">Dry run</button></form>
<h2>Delete the group</h2>
<form method="post" action="/groups/{{group["group_id"]}}/delete" id="delete-group" class="inline delete">
<input type="hidden" name="csrf" value="{{csrf}}">
<input name="confirm" placeholder="type {{group["group_id"]}} to delete"><button type="submit">Delete group</button></form>

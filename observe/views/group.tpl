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

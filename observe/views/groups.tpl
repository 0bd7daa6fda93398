% rebase("layout.tpl", title=title, user=user, csrf=csrf)
% if message:
<p class="message">{{message}}</p>
% end
<form method="get" action="/groups" id="search-groups" class="inline search">
<input name="q" value="{{search}}" placeholder="search groups" type="search"><button type="submit">Search</button></form>
<table id="groups"><tr><th>group</th><th>state</th><th class="num">members</th><th class="num">lag</th><th>topics</th></tr>
% for g in groups:
<tr><td><a href="/groups/{{g["group_id"]}}">{{g["group_id"]}}</a></td><td>{{g.get("group_state", g.get("state", ""))}}</td>
<td class="num members">{{g["members"]}}</td><td class="num lag">{{g.get("lag", "-")}}</td>
<td class="topics">{{", ".join(sorted(g.get("topics", [])))}}</td></tr>
% end
</table>
% if not groups:
<p class="hint">No group{{" matches " + repr(search) if search else ""}}.</p>
% end

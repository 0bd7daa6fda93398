% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<table id="groups"><tr><th>group</th><th>state</th></tr>
% for g in groups:
<tr><td><a href="/groups/{{g["group_id"]}}">{{g["group_id"]}}</a></td><td>{{g.get("group_state", g.get("state", ""))}}</td></tr>
% end
</table>

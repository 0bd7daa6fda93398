% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p>The authorizer is <b id="authorizer">{{"on" if authorizer else "off (every request is allowed)"}}</b>.
Change these with <code>odradek acls</code> and <code>odradek users</code>; this page only reads them.</p>
<h2>ACLs</h2>
<form method="get" action="/security" id="search-acls" class="inline search">
<input name="q" value="{{search}}" placeholder="search principal, resource, operation" type="search">
<button type="submit">Search</button></form>
<table id="acls"><tr><th>principal</th><th>host</th><th>resource</th><th>pattern</th><th>name</th>
<th>operation</th><th>permission</th></tr>
% for a in acls:
<tr><td>{{a["principal"]}}</td><td>{{a["host"]}}</td><td>{{a["resource"]}}</td><td>{{a["pattern"]}}</td>
<td>{{a["name"]}}</td><td>{{a["operation"]}}</td><td>{{a["permission"]}}</td></tr>
% end
</table>
<h2>Users</h2>
<table id="users"><tr><th>user</th><th>mechanisms</th></tr>
% for name, mechanisms in users.items():
<tr><td>{{name}}</td><td>{{", ".join(f"{m} ({n} iterations)" for m, n in mechanisms)}}</td></tr>
% end
</table>

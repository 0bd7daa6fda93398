% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p>The authorizer is <b id="authorizer">{{"on" if authorizer else "off (every request is allowed)"}}</b>.
% if editable:
Changes go to the broker as CreateAcls, DeleteAcls and AlterUserScramCredentials (Alter on the cluster, as in Kafka), the same as <code>odradek acls</code> and Kafka's tools.</p>
% else:
Changing them needs Alter on the cluster (as CreateAcls, DeleteAcls and AlterUserScramCredentials do): this page only reads them for you.</p>
% end
% if message:
<p class="message" id="security-message">{{message}}</p>
% end
<h2>ACLs</h2>
<form method="get" action="/security" id="search-acls" class="inline search">
<input name="q" value="{{search}}" placeholder="search principal, resource, operation" type="search">
<button type="submit">Search</button></form>
<table id="acls"><tr><th>principal</th><th>host</th><th>resource</th><th>pattern</th><th>name</th>
<th>operation</th><th>permission</th>{{!"<th></th>" if editable else ""}}</tr>
% for a in acls:
<tr><td>{{a["principal"]}}</td><td>{{a["host"]}}</td><td>{{a["resource"]}}</td><td>{{a["pattern"]}}</td>
<td>{{a["name"]}}</td><td>{{a["operation"]}}</td><td>{{a["permission"]}}</td>
% if editable:
<td><form method="post" action="/security/acls/delete" class="inline delete-acl"><input type="hidden" name="csrf" value="{{csrf}}">
% for k in ("principal", "host", "resource", "pattern", "name", "operation", "permission"):
<input type="hidden" name="{{k}}" value="{{a[k]}}">
% end
<button type="submit">Delete</button></form></td>
% end
</tr>
% end
</table>
% if editable:
<h3>Add an ACL</h3>
<form method="post" action="/security/acls" id="add-acl" class="inline">
<input type="hidden" name="csrf" value="{{csrf}}">
<select name="permission">{{!"".join(f"<option>{c}</option>" for c in choices["permission"])}}</select>
<input name="principal" placeholder="User:alice" required size="14">
from host <input name="host" value="*" size="10">
to <select name="operation">{{!"".join(f"<option>{c}</option>" for c in choices["operation"])}}</select>
on <select name="resource">{{!"".join(f"<option>{c}</option>" for c in choices["resource"])}}</select>
<select name="pattern">{{!"".join(f"<option>{c}</option>" for c in choices["pattern"])}}</select>
<input name="name" placeholder="name, * or a prefix (kafka-cluster for the cluster)" required size="30">
<button type="submit">Add ACL</button></form>
% end
<h2>Users</h2>
<table id="users"><tr><th>user</th><th>mechanisms</th>{{!"<th></th>" if editable else ""}}</tr>
% for name, mechs in users.items():
<tr><td>{{name}}</td><td>{{", ".join(f"{m} ({n} iterations)" for m, n in mechs)}}</td>
% if editable:
<td><form method="post" action="/security/users/delete" class="inline delete-user"><input type="hidden" name="csrf" value="{{csrf}}">
<input type="hidden" name="user" value="{{name}}"><input name="confirm" placeholder="type {{name}} to delete" size="18">
<button type="submit">Delete</button></form></td>
% end
</tr>
% end
</table>
% if editable:
<h3>Add a user, or change a user's password</h3>
<form method="post" action="/security/users" id="add-user" class="inline" autocomplete="off">
<input type="hidden" name="csrf" value="{{csrf}}">
<input name="user" placeholder="user name" required size="14">
<input name="password" type="password" placeholder="password" required autocomplete="new-password" size="14">
<select name="mechanism"><option value="both">{{" and ".join(mechanisms)}}</option>
% for m in mechanisms:
<option>{{m}}</option>
% end
</select>
<input name="iterations" value="{{iterations}}" size="6" title="PBKDF2 iterations (4096 to 16384, as Kafka)">
<button type="submit">Store user</button></form>
<p class="hint">The password is salted and hashed by the console (SCRAM), sent as AlterUserScramCredentials, and never shown or logged.</p>
% end

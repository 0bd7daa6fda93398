% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p id="registry">Schema registry <code>{{url}}</code>: global compatibility <b id="global-level">{{level}}</b>,
mode <b id="mode">{{mode}}</b> (docs/SCHEMAS.md).</p>
<table id="subjects"><tr><th>subject</th><th>latest version</th><th>schema id</th><th>type</th><th>compatibility</th></tr>
% for r in rows:
<tr><td><a href="/schemas/{{r["subject"]}}">{{r["subject"]}}</a></td><td>{{r["version"]}}</td><td>{{r["id"]}}</td>
<td>{{r["type"]}}</td><td>{{r["level"]}}</td></tr>
% end
</table>
<p>{{total}} subject(s){{f", the first {len(rows)} by name shown" if total > len(rows) else ""}}.</p>

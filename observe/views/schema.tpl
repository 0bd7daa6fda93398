% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p>Compatibility <b id="level">{{level}}</b>. <a href="/schemas">All subjects</a></p>
% for v in versions:
<section class="version" id="version-{{v["version"]}}"><h2>version {{v["version"]}} (schema id {{v["id"]}}, {{v["type"]}})</h2>
% if v["references"]:
<p>references: {{", ".join(f'{r.get("name")} = {r.get("subject")} v{r.get("version")}' for r in v["references"])}}</p>
% end
<pre class="schema">{{v["text"]}}</pre></section>
% end

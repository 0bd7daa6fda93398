<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{title}} · Odradek</title>
<link rel="stylesheet" href="/static/console.css"></head>
<body>
<nav><b>Odradek</b>
<a href="/">Cluster</a> <a href="/brokers">Brokers</a> <a href="/topics">Topics</a> <a href="/groups">Groups</a>
<a href="/schemas">Schemas</a> <a href="/charts">Charts</a> <a href="/security">ACLs</a> <a href="/metrics">Metrics</a>
% if defined("user") and user:
<form method="post" action="/logout" class="inline signed-in" id="signed-in"><span>signed in as <b>{{user}}</b></span>
<input type="hidden" name="csrf" value="{{csrf}}"><button type="submit">Sign out</button></form>
% end
</nav>
<main><h1>{{title}}</h1>
{{!base}}
</main></body></html>

<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{title}} · Odradek</title>
<link rel="stylesheet" href="/static/console.css"></head>
<body>
<nav><b>Odradek</b>
<a href="/">Cluster</a> <a href="/topics">Topics</a> <a href="/groups">Groups</a>
<a href="/charts">Charts</a> <a href="/metrics">Metrics</a></nav>
<main><h1>{{title}}</h1>
{{!base}}
</main></body></html>

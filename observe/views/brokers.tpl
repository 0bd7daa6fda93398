% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p>From the cluster's metadata: every live broker, its listeners, the replicas it hosts, the partitions it leads and
how many of those are under-replicated; its disk from DescribeLogDirs (the bytes of its logs, and what its
log directories' volumes have free). Partitions without a live leader: <b id="offline">{{offline}}</b>.</p>
<table id="brokers"><tr><th>broker</th><th>address</th><th>rack</th><th>listeners</th><th class="num">replicas</th>
<th class="num">leaders</th><th class="num">under-replicated</th><th class="num">logs</th><th class="num">free</th><th></th></tr>
% for b in brokers:
<tr><td>{{b["id"]}}</td><td>{{b["address"]}}</td><td>{{b["rack"] or "-"}}</td>
<td class="listeners">{{"-" if not b["listeners"] else ""}}
% for x in b["listeners"]:
<div>{{x}}</div>
% end
</td>
<td class="num">{{b["replicas"]}}</td><td class="num">{{b["leaders"]}}</td><td class="num">{{b["under_replicated"]}}</td>
% if "disk_error" in b:
<td class="num" colspan="2" title="{{b["disk_error"]}}">unknown</td>
% else:
<td class="num" title="the bytes of the partitions it hosts">{{size(b["logs"])}}</td>
<td class="num" title="of {{size(b["total"])}}">{{size(b["free"])}} of {{size(b["total"])}}</td>
% end
<td>{{"controller" if b["id"] == controller else ""}}{{" · this console's broker" if b["id"] == here else ""}}</td></tr>
% end
</table>

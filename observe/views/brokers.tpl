% rebase("layout.tpl", title=title, user=user, csrf=csrf)
<p>From the cluster's metadata: every live broker, the replicas it hosts, the partitions it leads and
how many of those are under-replicated. Partitions without a live leader: <b id="offline">{{offline}}</b>.</p>
<table id="brokers"><tr><th>broker</th><th>address</th><th>rack</th><th class="num">replicas</th>
<th class="num">leaders</th><th class="num">under-replicated</th><th class="num">disk</th><th></th></tr>
% for b in brokers:
<tr><td>{{b["id"]}}</td><td>{{b["address"]}}</td><td>{{b["rack"] or "-"}}</td><td class="num">{{b["replicas"]}}</td>
<td class="num">{{b["leaders"]}}</td><td class="num">{{b["under_replicated"]}}</td>
<td class="num" title="its logs' bytes (known for this broker only)">{{size(disk) if b["id"] == here else "-"}}</td>
<td>{{"controller" if b["id"] == controller else ""}}{{" · this console's broker" if b["id"] == here else ""}}</td></tr>
% end
</table>

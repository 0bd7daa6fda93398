"""docs/OBSERVABILITY.md lists every exported metric, and the Grafana dashboard uses only
metrics the broker exports."""
from __future__ import annotations

import json
import pathlib
import re

from odradek.observe.catalogue import all_specs

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUFFIXES = ("_bucket", "_sum", "_count")


def exported() -> set[str]:
    return {s.name + ("_total" if s.type == "counter" else "") for s in all_specs()}


def test_every_metric_is_listed_in_observability_md():
    doc = (ROOT / "docs" / "OBSERVABILITY.md").read_text()
    listed = set(re.findall(r"`(odradek_[a-z_]+)`", doc))
    assert exported() <= listed, f"not in docs/OBSERVABILITY.md: {sorted(exported() - listed)}"


def test_the_docs_list_no_metric_that_does_not_exist():
    doc = (ROOT / "docs" / "OBSERVABILITY.md").read_text()
    table = [line for line in doc.splitlines() if line.startswith("| `odradek_")]
    names = {re.match(r"\| `(odradek_[a-z_]+)`", line).group(1) for line in table}
    assert names and names <= exported(), sorted(names - exported())


def test_the_grafana_dashboard_uses_only_exported_metrics():
    dash = json.loads((ROOT / "dashboards" / "odradek-broker.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set()
    for expr in exprs:
        for name in re.findall(r"odradek_[a-z_]+", expr):
            for suffix in SUFFIXES:
                if name.endswith(suffix) and name[:-len(suffix)] in {s.name for s in all_specs()}:
                    name = name[:-len(suffix)]
            used.add(name)
    assert used and used <= exported(), f"the dashboard uses unknown metrics: {sorted(used - exported())}"

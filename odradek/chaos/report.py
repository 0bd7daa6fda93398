"""The chaos report: ``report.json`` (the checker's result, the schedule, the settings),
``report.txt`` (counts per anomaly) and ``chaos.png``: acknowledged and consumed records
per second over time, failed sends, and every fault as a shaded span with its name.

The plot needs matplotlib (the ``plot`` extra; Agg backend, no display); without it the
report says so and the text and JSON are still written.
"""
from __future__ import annotations

import collections
import json
import os

from odradek.chaos.checker import summary


def fault_spans(events: list[dict]) -> list[tuple[float, float, str]]:
    """``(start, end, label)`` of each fault, from its ``fault`` and ``heal`` events."""
    open_: dict[tuple, list] = collections.defaultdict(list)
    spans = []
    end = max((e["t"] for e in events), default=0.0)
    for e in events:
        key = (e.get("name"), e.get("broker"))
        if e["type"] == "fault":
            open_[key].append(e["t"])
        elif e["type"] == "heal" and open_[key]:
            start = open_[key].pop(0)
            spans.append((start, e["t"], _label(key)))
    for key, starts in open_.items():
        spans += [(s, end, _label(key)) for s in starts]
    return sorted(spans)


def _label(key) -> str:
    name, broker = key
    return name if broker is None else f"{name} b{broker}"


def rates(events: list[dict], kind: str) -> dict[int, int]:
    """Records per whole second: ``ack`` and ``fail`` count values, ``poll`` counts records."""
    out: dict[int, int] = collections.Counter()
    for e in events:
        if e["type"] == kind:
            out[int(e["t"])] += len(e["records"]) if kind == "poll" else 1
    return out


def write(out_dir: str, events: list[dict], result: dict, meta: dict) -> dict[str, str]:
    """Write the report files; ``{"json", "text", "plot"}`` paths (plot: "" if not drawn)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "report.json"), "text": os.path.join(out_dir, "report.txt"),
             "plot": os.path.join(out_dir, "chaos.png")}
    spans = fault_spans(events)
    with open(paths["json"], "w") as f:
        json.dump({**meta, "result": result, "faults": spans}, f, indent=1)
    text = summary(result) + "\nfaults:\n" + "\n".join(f"  {s:7.1f}s - {e:7.1f}s  {n}" for s, e, n in spans)
    with open(paths["text"], "w") as f:
        f.write(text + "\n")
    try:
        plot(paths["plot"], events, spans, meta.get("title", "odradek chaos"))
    except ImportError:
        paths["plot"] = ""
    return paths


def plot(path: str, events: list[dict], spans, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    end = int(max((e["t"] for e in events), default=0)) + 1
    xs = list(range(end))
    fig, ax = plt.subplots(figsize=(14, 5))
    series = {}
    for kind, label, color in (("ack", "acknowledged/s", "tab:blue"), ("poll", "read/s (all readers)", "tab:green"),
                               ("fail", "failed sends/s", "tab:red")):
        r = rates(events, kind)
        series[kind] = [r.get(x, 0) for x in xs]
        ax.plot(xs, series[kind], label=label, color=color, linewidth=0.9)
    # a reader catching up after a fault reads thousands at once: keep the steady rates legible
    steady = sorted(series["poll"] + series["ack"])[int(0.98 * (2 * len(xs) - 1))] if xs else 1
    top = max(steady * 1.6, max(series["fail"], default=0) * 1.1, 10)
    ax.set_ylim(0, top)
    colors = plt.get_cmap("tab20")
    names = sorted({s[2].split(" ")[0] for s in spans})
    for i, (s, e, label) in enumerate(spans):
        c = colors(names.index(label.split(" ")[0]) % 20)
        ax.axvspan(s, e, color=c, alpha=0.25)
        ax.text(s, top * (0.97 - 0.06 * (i % 4)), label, fontsize=7, va="top")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("records per second")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

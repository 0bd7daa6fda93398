"""The checker: Jepsen's queue anomalies in a chaos run's history.

Pure functions of the history (``workload.History`` events), the final read (every record
below the healed cluster's high watermarks, ``[[partition, offset, value]]``) and the
replica comparison. Anomalies (each a count and up to ``EXAMPLES`` examples):

- ``lost``: acknowledged values absent from the final read;
- ``duplicates``: values stored at more than one offset (extra copies counted;
  reported, not judged);
- ``inconsistent_offsets``: an offset seen holding two values, by any observer
  (acknowledgement, any poll, the final read);
- ``unseen``: values in the final read no group member ever polled;
- ``poll_skips``: a reader moved past an offset that holds a record, within one assignment
  (``generation``) of one partition; ``nonmonotonic_polls``: a reader's offset went back or
  repeated within one assignment;
- ``replica_divergence``: replicas differing below the high watermark (by offset, epoch
  and CRC per batch);
- ``failed_sends`` (and their errors by kind) and ``indeterminate`` sends (neither
  acknowledged nor failed when the run ended) are counted too, and ``ack_gaps``: stretches
  of more than 5 s without an acknowledgement (availability, not judged).
"""
from __future__ import annotations

import collections

EXAMPLES = 10
ANOMALIES = ["lost", "duplicates", "inconsistent_offsets", "unseen", "poll_skips", "nonmonotonic_polls",
             "replica_divergence"]


def check(events: list[dict], final: list[list], replica_problems: list[str]) -> dict:
    acked = {e["value"]: (e["partition"], e["offset"]) for e in events if e["type"] == "ack"}
    sent = {e["value"] for e in events if e["type"] == "send"}
    failed = {e["value"]: e["error"] for e in events if e["type"] == "fail" and e["value"] not in acked}
    stored: dict[int, list] = collections.defaultdict(list)  # value -> [(partition, offset)]
    for p, o, v in final:
        stored[v].append((p, o))
    found: dict = {}

    def report(name: str, items: list) -> None:
        found[name] = {"count": len(items), "examples": items[:EXAMPLES]}

    report("lost", [{"value": v, "acked_at": list(at)} for v, at in sorted(acked.items()) if v not in stored])
    report("duplicates", [{"value": v, "offsets": [list(x) for x in at]}
                          for v, at in sorted(stored.items()) if len(at) > 1])
    found["duplicates"]["count"] = sum(len(at) - 1 for at in stored.values())
    report("inconsistent_offsets", _inconsistent(events, final))
    polled = {r[2] for e in events if e["type"] == "poll" and e["mode"] == "group" for r in e["records"]}
    report("unseen", [v for v in sorted(stored) if v not in polled])
    skips, backs = _poll_order(events, {(p, o) for p, o, _ in final})
    report("poll_skips", skips)
    report("nonmonotonic_polls", backs)
    report("replica_divergence", list(replica_problems))
    kinds = collections.Counter(err.split(":")[0] + ":" + err.split(":")[1][:80] if ":" in err else err
                                for err in failed.values())
    return {
        "sent": len(sent), "acknowledged": len(acked), "failed_sends": len(failed),
        "failed_by_error": dict(kinds.most_common(8)),
        "indeterminate": len(sent - set(acked) - set(failed)),
        "stored": len(final), "anomalies": found, "ack_gaps": ack_gaps(events),
    }


def ack_gaps(events: list[dict], longer_than: float = 5.0) -> list[dict]:
    """Stretches of more than ``longer_than`` seconds with no acknowledgement while sends
    were going on (availability, not safety), the longest first."""
    acks = [e["t"] for e in events if e["type"] == "ack"]
    gaps = [{"seconds": round(b - a, 1), "from": a, "to": b} for a, b in zip(acks, acks[1:]) if b - a > longer_than]
    return sorted(gaps, key=lambda g: -g["seconds"])


def _inconsistent(events: list[dict], final: list[list]) -> list[dict]:
    seen: dict[tuple, set] = collections.defaultdict(set)
    for e in events:
        if e["type"] == "ack":
            seen[(e["partition"], e["offset"])].add(e["value"])
        elif e["type"] == "poll":
            for p, o, v in e["records"]:
                seen[(p, o)].add(v)
    for p, o, v in final:
        seen[(p, o)].add(v)
    return [{"offset": list(k), "values": sorted(vs)} for k, vs in sorted(seen.items()) if len(vs) > 1]


def _poll_order(events: list[dict], stored: set) -> tuple[list, list]:
    last: dict[tuple, int] = {}  # (reader, generation, partition) -> last offset read
    skips, backs = [], []
    for e in events:
        if e["type"] != "poll":
            continue
        for p, o, _ in e["records"]:
            key = (e["reader"], e["generation"], p)
            prev = last.get(key)
            last[key] = o
            if prev is None:
                continue
            if o <= prev:
                backs.append({"reader": e["reader"], "partition": p, "from": prev, "to": o, "t": e["t"]})
            elif o > prev + 1:
                missed = [x for x in range(prev + 1, min(o, prev + 1000)) if (p, x) in stored]
                if missed:
                    skips.append({"reader": e["reader"], "partition": p, "from": prev, "to": o,
                                  "skipped": len(missed), "t": e["t"]})
    return skips, backs


def summary(result: dict) -> str:
    """The report's text: counts per anomaly, then the sends."""
    lines = [f"sent {result['sent']}, acknowledged {result['acknowledged']}, failed {result['failed_sends']}, "
             f"indeterminate {result['indeterminate']}, stored {result['stored']}"]
    for name in ANOMALIES:
        a = result["anomalies"][name]
        lines.append(f"  {name:22} {a['count']}" + (f"   e.g. {a['examples'][:2]}" if a["count"] else ""))
    gaps = result.get("ack_gaps", [])
    if gaps:
        lines.append(f"  no acknowledgement for more than 5 s: {len(gaps)} times, the longest {gaps[0]['seconds']} s "
                     f"(from {gaps[0]['from']} s)")
    for err, n in result["failed_by_error"].items():
        lines.append(f"  failed send: {n} x {err}")
    return "\n".join(lines)

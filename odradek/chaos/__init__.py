"""The fault battery: ``odradek chaos`` (docs/RELIABILITY.md).

A local cluster (ZooKeeper and brokers on 127.0.0.1) behind a fault proxy (``proxy``),
producers of unique integers, a consumer group and an assign-mode reader recording every
event (``workload``), a nemesis injecting faults one at a time and combined (``nemesis``),
and, after healing, a checker reading the whole history for Jepsen's queue anomalies
(``checker``) and a report with counts and a plot (``report``). ``runner`` ties them
together; ``replicas`` reads replica files for divergence below the high watermark.
"""

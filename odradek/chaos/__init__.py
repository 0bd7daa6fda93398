"""The fault battery: ``odradek chaos`` (docs/RELIABILITY.md).

A local cluster (ZooKeeper and brokers on 127.0.0.1) behind a fault proxy (``proxy``),
producers of unique integers, a consumer group and an assign-mode reader recording every
event (``workload``), a nemesis injecting faults one at a time and combined (``nemesis``),
and, after healing, a checker reading the whole history for Jepsen's queue anomalies
(``checker``) and a report with counts and a plot (``report``). ``runner`` ties them
together; ``replicas`` reads replica files for divergence below the high watermark.
``powercut`` cuts every broker's power at once and counts what acknowledged writes it cost;
``fsync_trace`` records what each broker process fsynced, for that model; ``cli`` is
``odradek chaos``. Each module's names without a leading underscore are its public surface
(the ones ``odradek/cli.py`` and the tests import); the rest is private to it.
"""

"""Benchmarks, one module per tool, outside the library layers they measure.

Each module has a ``main(argv)`` and runs as ``python -m odradek.bench.<name>``; the ones a user
runs most are also ``odradek perf <name>`` (odradek/cli.py). Figures and their commands are in
docs/BENCHMARKS.md.

* ``hop``: one actor hop (ZeroMQ ipc, msgpack header plus raw frames) between two processes
  (``odradek perf hop``);
* ``ping``: PING round trips through a running broker's processor and handler pool
  (``odradek perf ping``);
* ``storage``: the log library alone: append, lookup, recovery, memory;
* ``placement``: how many partitions one log-actor process holds, on a real broker;
* ``pipeline``: the Spark connector's batch read and write (needs the ``spark`` extra);
* ``reassign``: moving 1 GiB of partition data to a new broker (``odradek perf reassign``);
* ``security``: PLAINTEXT against SASL_SSL, and 1,000 ACLs against none (``odradek perf security``).

``odradek/perf/`` holds the client benchmarks (produce, consume, end-to-end latency,
replicated, scrape) behind ``odradek perf``.
"""

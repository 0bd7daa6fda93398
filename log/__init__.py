"""log: Odradek's storage (layer 3): the partition log (``log.log.Log``, single writer: the
partition's log actor), its read-only twin for other processes (``log.reader.LogReader``),
recovery, retention and compaction, and the log, fetch and replica-fetcher actors.
Formats: docs/FORMAT.md; flows: docs/ARCHITECTURE.md (Storage).
"""

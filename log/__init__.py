"""log: Odradek's storage (the record-batch format it stores is the pure layer's ``core.records``):
the durable partition log (``log.log.Log``, single writer: the partition's log actor), its
read-only twin for other processes (``log.reader.LogReader``), crash recovery, retention and
compaction (``log.cleaner``). See docs/ARCHITECTURE.md (Storage) and docs/FORMAT.md."""

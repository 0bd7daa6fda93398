"""core: the pure layer (layer 1 of docs/CONTRIBUTING.md), shared by broker, client and tools.

Holds the protocol's numbers and error codes (``protocol``), the native framing (``codec``),
request-field checks (``fields``), SASL (``sasl``), the Kafka wire codec (``kafka/``), the
record-batch formats (``records``, ``kafka_batch``, the C checker ``_recordscan``), bounded
decompression (``inflate``), the storage errors (``errors``) and topic configuration (``config``).
Invariants: no actor, no socket, no file; imports only this folder, the standard library and
the codecs' libraries (``tests/test_layers.py``).
"""

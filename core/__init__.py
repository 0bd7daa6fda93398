"""core: the pure layer (layer 1 of docs/CONTRIBUTING.md): what the broker, the client and the
tools share and what does no I/O. The protocol's numbers and error codes (``protocol``), the
native framing (``codec``), request-field checks (``fields``), SASL's mechanisms (``sasl``), the
Kafka wire protocol's codec (``kafka/``), the record-batch formats (``records``, ``kafka_batch``,
the C record checker ``_recordscan``), bounded decompression (``inflate``), the error classes
(``errors``) and topic configuration (``config``). Imports here stay in this folder and the
standard library (and the codecs' libraries): no actor, no socket, no file."""

"""Kafka's wire protocol at the bottom layer: pure, sans-io (docs/KAFKA.md).

``framing`` splits a byte stream into requests and frames responses; ``schema`` turns bodies
into plain dicts and back (through kio); ``apis`` is the translation table between a Kafka
request and the internal request the broker's actors serve; ``groups``, ``admin``, ``txn`` and
``security`` register their families in it; ``connection`` is one connection's state.
"""

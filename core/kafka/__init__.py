"""Kafka's wire protocol at the bottom layer: pure, sans-io (docs/KAFKA.md).

``framing`` splits a byte stream into requests and frames responses (headers v0/v1/v2);
``schema`` turns request and response bodies into plain dicts and back, through kio's
types generated from Kafka's own JSON schemas; ``apis`` is the translation table (per API
key: versions, ``to_internal``, ``from_internal``) between a Kafka request and the internal
request every broker actor serves; ``groups`` and ``admin`` add their families to it.
"""

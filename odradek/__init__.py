"""Odradek, a Kafka-class streaming log broker: the public face.

``odradek serve`` runs a broker; the bundled client is importable from here::

    from odradek import Producer, Consumer, Admin, TopicPartition, RecordMetadata, Record
    from odradek import errors          # one OdradekError subclass per error code

The client classes load on first use, so ``odradek serve`` does not import them.
"""
__version__ = "0.1.0"

from odradek.core.protocol import ErrorCode, OdradekError  # noqa: E402
from odradek.types import Record, RecordMetadata, TopicPartition  # noqa: E402

__all__ = ["Producer", "Consumer", "Admin", "TopicPartition", "RecordMetadata", "Record",
           "OdradekError", "ErrorCode", "errors"]

_LAZY = {"Producer": "odradek.producer", "Consumer": "odradek.consumer", "Admin": "odradek.admin",
         "errors": "odradek.errors"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'odradek' has no attribute {name!r}")
    import importlib
    mod = importlib.import_module(module)
    value = mod if name == "errors" else getattr(mod, name)
    globals()[name] = value
    return value

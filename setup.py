"""The C extensions (metadata and everything else: pyproject.toml), both optional.

``odradek.core._recordscan`` checks each record of a produced Kafka batch as Kafka's
DefaultRecord reader does, at about a hundredth of the Python reference's cost
(core/_recordscan.c, core/kafka_batch.py). ``optional``: without a C compiler or Python's headers
the install still succeeds and the broker uses the Python reference, saying so in its log.
``odradek._recordbuild`` builds the bundled consumer's Records of a native batch and the bundled
producer's batches of plain values (header, msgpack rows, CRC in one allocation); its Python
twins in odradek/consumer.py and odradek/producer_encoding.py give the same results, and tests
compare them. It needs nothing beyond Python's headers: the CRC is zlib's crc32 as Python's own
zlib module exports it, so no zlib headers or libraries=["z"] here.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("odradek.core._recordscan", ["core/_recordscan.c"], optional=True),
                   # the bundled consumer's Records of a native batch and the producer's plain
                   # batches (odradek/_recordbuild.c); optional too: without it both work in Python
                   Extension("odradek._recordbuild", ["odradek/_recordbuild.c"], optional=True)])

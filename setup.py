"""The C extensions (metadata and everything else: pyproject.toml), both optional.

``odradek.core._recordscan`` checks each record of a produced Kafka batch as Kafka's
DefaultRecord reader does, at about a hundredth of the Python reference's cost
(core/_recordscan.c, core/kafka_batch.py). ``optional``: without a C compiler or Python's headers
the install still succeeds and the broker uses the Python reference, saying so in its log.
``odradek._recordbuild`` builds the bundled consumer's Records of a native batch (its Python
twin in odradek/consumer.py gives the same rows; a test compares them).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("odradek.core._recordscan", ["core/_recordscan.c"], optional=True),
                   # the bundled consumer's Records of a native batch (odradek/_recordbuild.c);
                   # optional too: without it the consumer builds them in Python
                   Extension("odradek._recordbuild", ["odradek/_recordbuild.c"], optional=True)])

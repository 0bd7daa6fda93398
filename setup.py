"""The one C extension (metadata and everything else: pyproject.toml).

``odradek.core._recordscan`` checks each record of a produced Kafka batch as Kafka's
DefaultRecord reader does, at about a hundredth of the Python reference's cost
(core/_recordscan.c, core/kafka_batch.py). ``optional``: without a C compiler or Python's headers
the install still succeeds and the broker uses the Python reference, saying so in its log.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("odradek.core._recordscan", ["core/_recordscan.c"], optional=True)])

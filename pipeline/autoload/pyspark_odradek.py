"""Zero-configuration registration of the ``odradek`` Spark format.

PySpark (4.0+) looks, when a session first resolves a data source name, for top-level modules
named ``pyspark_*`` on its Python workers' path that define ``DefaultSource``, and registers
each under its ``name()``. This module is that hook: with its directory on the path (or the
module installed at top level), ``spark.read.format("odradek")`` works without
``pipeline.register(spark)``.
"""
from odradek.pipeline.source import OdradekDataSource as DefaultSource

__all__ = ["DefaultSource"]

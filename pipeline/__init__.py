"""Odradek for Spark: the ``odradek`` data source and the example pipelines.

    from odradek import pipeline
    pipeline.register(spark)                       # once per SparkSession
    df = (spark.read.format("odradek")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "clicks").load())

The source mirrors Spark's Kafka source (same columns, same option names), so a Kafka job
ports by changing the format name. Modules: ``source`` (the data source and its readers),
``sink`` (writers), ``broker`` (planning on the driver, fetching on executors), ``columns``
(record batches to Arrow), ``options``, ``clicks`` (the example pipeline), ``cli``
(``odradek pipeline run``), ``bench``. Importing this package does not import pyspark.
"""
from __future__ import annotations

__all__ = ["register", "FORMAT"]

FORMAT = "odradek"


def register(spark) -> None:
    """Register the ``odradek`` format with ``spark`` (idempotent per session)."""
    from odradek.pipeline.source import OdradekDataSource
    spark.dataSource.register(OdradekDataSource)

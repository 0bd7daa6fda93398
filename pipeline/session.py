"""A SparkSession set up for Odradek: the right Python on the workers, the format registered.

Runs in the driver process. Spark starts its Python workers with ``PYSPARK_PYTHON`` (default
``python3`` on the PATH), which may lack the project's packages (lz4, msgpack); a session built
here points them at this interpreter unless the caller already chose one. On a cluster the
executors' Python is the cluster's: see docs/PIPELINE.md.
"""
from __future__ import annotations

import os
import sys


def session(master: str | None = "local[2]", app: str = "odradek", conf: dict | None = None):
    """Get or create a SparkSession with the ``odradek`` format registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    local = not master or master.startswith("local")
    if local:  # keep a local Spark on the loopback interface
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from odradek import pipeline

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    defaults = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
                "spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"}
    if local:
        defaults.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    for k, v in {**defaults, **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("ODRADEK_SPARK_LOG_LEVEL", "ERROR"))
    pipeline.register(spark)
    return spark

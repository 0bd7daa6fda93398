"""The command line and zero-configuration registration, each in a fresh process (its own Spark)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT
from tests.pipeline.support import create, produce

AUTOLOAD = os.path.join(ROOT, "pipeline", "autoload")


def _env(**extra) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, extra.get("PYTHONPATH"), os.environ.get("PYTHONPATH")) if p)
    return env


def test_the_format_resolves_without_register_when_pyspark_odradek_is_on_the_path(mod_broker, topic_name):
    create(mod_broker.bootstrap, topic_name)
    produce(mod_broker.bootstrap, topic_name, 5, headers=False)
    script = textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .getOrCreate())
        try:
            df = (spark.read.format("odradek").option("kafka.bootstrap.servers", "{mod_broker.bootstrap}")
                  .option("subscribe", "{topic_name}").load())
            print("rows", df.count())
        finally:
            spark.stop()
    """)
    r = subprocess.run([sys.executable, "-c", script], env=_env(PYTHONPATH=AUTOLOAD), capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rows 5" in r.stdout


def test_pipeline_run_clicks_produces_the_closed_minutes(mod_broker, tmp_path):
    out = str(tmp_path / "out")
    cmd = [sys.executable, "-m", "pipeline.cli", "run", "clicks", "--bootstrap-server", mod_broker.bootstrap,
           "--events", "2000", "--minutes", "4", "--output", out, "--start-ms", "1700000040000"]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "produced 2000 clicks" in r.stdout
    # 4 minutes of events, watermark 1 minute: the first two minutes are closed, 8 pages each
    assert "16 (minute, page) counts" in r.stdout
    assert os.path.isdir(os.path.join(out, "checkpoint", "offsets"))

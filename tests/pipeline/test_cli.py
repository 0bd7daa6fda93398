"""Zero-configuration registration and the command line, in one fresh process (its own Spark).

One subprocess for both, since a Spark start costs 10-20 s: it first reads with
``format("odradek")`` and no ``register`` call (bin/_env.sh puts ``pipeline/autoload`` on the
environment's path with a ``.pth`` file: nothing is set here), then
runs ``pipeline.cli.main(["run", "clicks", ...])``, the code behind both
``python -m pipeline.cli run clicks`` and ``odradek pipeline run clicks``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT
from tests.pipeline.support import create, produce

def test_zero_config_registration_then_pipeline_run_clicks(mod_broker, topic_name, tmp_path):
    bs = mod_broker.bootstrap
    create(bs, topic_name)
    produce(bs, topic_name, 5, headers=False)
    out = str(tmp_path / "out")
    script = textwrap.dedent(f"""
        import sys
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        df = (spark.read.format("odradek").option("kafka.bootstrap.servers", "{bs}")
              .option("subscribe", "{topic_name}").load())
        print("zero-config rows", df.count(), flush=True)
        from odradek.pipeline import cli
        sys.exit(cli.main(["run", "clicks", "--bootstrap-server", "{bs}", "--events", "2000", "--minutes", "4",
                           "--output", {out!r}, "--start-ms", "1700000040000"]))
    """)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "zero-config rows 5" in r.stdout
    assert "produced 2000 clicks" in r.stdout
    # 4 minutes of events, watermark 1 minute: the first two minutes are closed, 8 pages each
    assert "16 (minute, page) counts" in r.stdout
    assert os.path.isdir(os.path.join(out, "checkpoint", "offsets"))


def test_python_m_pipeline_cli_explains_itself():
    r = subprocess.run([sys.executable, "-m", "odradek.pipeline.cli", "--help"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0 and "clicks" in r.stdout and "--master" in r.stdout


def test_add_parser_plugs_pipeline_into_the_odradek_command_line():
    import argparse

    from odradek import cli
    from odradek.pipeline import cli as pipeline_cli
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if "pipeline" not in sub.choices:  # until odradek/cli.py calls add_parser itself
        pipeline_cli.add_parser(sub, cli._config_args, cli._bootstrap)
    args = parser.parse_args(["pipeline", "run", "clicks", "--events", "0",
                              "--set", "listeners=PLAINTEXT://127.0.0.1:9999"])
    assert args.func is pipeline_cli.cmd_pipeline and args.name == "clicks" and args.events == 0
    assert cli._bootstrap(args) == "127.0.0.1:9999"

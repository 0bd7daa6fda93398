"""Progress where work is long: perf's live line and --plot."""
from __future__ import annotations

import io
import subprocess
import sys

from odradek.perf import Stats


def test_the_live_line_is_rewritten_in_place_with_rate_and_latency_so_far():
    out = io.StringIO()
    stats = Stats(report_ms=60000, out=out, live=True)
    stats.sample(2.0)
    stats.tick_start -= 1.0  # a second has passed
    stats.progress(500, 50_000)
    line = out.getvalue()
    assert line.startswith("\r\x1b[K500 records, ") and "records/s" in line and "p99 2.0 ms" in line
    assert stats.timeline and stats.timeline[0][1] > 0
    stats.summary(500, 50_000, 1.0)
    assert "\r\x1b[K500 records sent" in out.getvalue()  # the live line is cleared before the summary


def test_no_live_line_when_the_output_is_not_a_terminal():
    out = io.StringIO()
    stats = Stats(report_ms=60000, out=out)
    stats.tick_start -= 1.0
    stats.progress(10, 100)
    assert out.getvalue() == "" and len(stats.timeline) == 1


def test_perf_produce_writes_its_plot(broker, tmp_path):
    path = tmp_path / "produce.png"
    proc = subprocess.run([sys.executable, "-m", "odradek", "perf", "produce", "--bootstrap-server",
                           broker.bootstrap, "--topic", "plotted", "--num-records", "20000", "--record-size", "100",
                           "--no-redis", "--plot", str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"Plot written to {path}" in proc.stdout
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_perf_refuses_a_plot_file_it_cannot_write_before_running():
    proc = subprocess.run([sys.executable, "-m", "odradek", "perf", "produce", "--bootstrap-server", "127.0.0.1:1",
                           "--topic", "t", "--num-records", "1", "--plot", "out.pdf"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and ".png or .svg" in proc.stderr


def test_long_work_reports_its_progress_in_the_heartbeat_once_a_second_then_clears_it():
    from odradek.actors.runtime import Actor
    now = [100.0]
    actor = Actor("log-0", "/nonexistent", clock=lambda: now[0])
    actor.report_progress("opening partitions: 1/10")
    assert actor.heartbeat_fields().progress == ""  # under a second: nothing to say
    now[0] += 1.5
    actor.report_progress("opening partitions: 5/10")
    assert actor.heartbeat_fields().progress == "opening partitions: 5/10"
    now[0] += 0.2
    actor.report_progress("opening partitions: 6/10")
    assert actor.heartbeat_fields().progress == "opening partitions: 5/10"
    actor.report_progress("opened 10 partitions", done=True)
    assert actor.heartbeat_fields().progress == ""

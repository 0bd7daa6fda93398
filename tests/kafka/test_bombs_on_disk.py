"""A compression bomb already in a segment (written before produce validation existed, here
appended to the files directly while the broker is down) costs every reader at most the
bound of core/inflate.py: the fetch actor's lookup by timestamp, the console's message browser
(the metrics actor), the bundled consumer, dump-log and the cleaner. Peak memory is each
process's VmHWM (the kernel's high-water mark of its resident set), read beside psutil's RSS."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import urllib.request

import psutil
import pytest

from odradek import Admin
from odradek.core.config import LogConfig
from odradek.core.inflate import DEFAULT_LIMIT
from odradek.log.log import Log
from odradek.core.records import encode_batch
from tests.conftest import BrokerProcess
from tests.log.test_batch_validation import BOMB_MIB, bomb

TOPIC = "bombed"
MiB = 1 << 20


def peak_rss(proc: psutil.Process) -> int:
    """The process's resident high-water mark (bytes), from /proc/<pid>/status."""
    with open(f"/proc/{proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    return proc.memory_info().rss


def reset_peak(proc: psutil.Process) -> None:
    """Restart the high-water mark at the current RSS (Linux: write 5 to clear_refs)."""
    with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
        f.write("5")


def plant(log_dir: str) -> None:
    """Offset 0: a sound record at 500 ms; offset 1: a gzip bomb (one record of BOMB_MIB MiB) at 1000 ms."""
    lg = Log(log_dir, LogConfig())
    try:
        lg.append(bytearray(encode_batch([(b"k", b"fine")], timestamp_ms=500)))
        lg.append(bomb("gzip"))
        lg.flush()
    finally:
        lg.close()


@pytest.fixture(scope="module")
def bombed(tmp_path_factory):
    data = str(tmp_path_factory.mktemp("bombed"))
    b = BrokerProcess(data, {}).start()
    try:
        with Admin(b.bootstrap) as a:
            a.create_topic(TOPIC, 1)
    finally:
        b.stop()
    plant(os.path.join(data, f"{TOPIC}-0"))
    b = BrokerProcess(data, {}).start()
    try:
        yield b
    finally:
        b.discard()


def actor(broker, role: str) -> psutil.Process:
    names = [a["name"] for a in broker.status()["actors"] if a["name"].startswith(role)]
    assert names, f"no {role} actor"
    return broker.actor_process(names[0])


# A child's peak RSS as its own memory map saw it. Not wait4's ru_maxrss: Linux carries the
# parent's high-water mark across fork and exec into it, so a child of a pytest that has grown
# to 460 MiB over a full run "peaked" at 460 MiB whatever it did (the fresh-clone CI run).
PEAK_AT_EXIT = ("import atexit, sys\n"
                "atexit.register(lambda: print('PEAK_KB', next(l.split()[1] for l in open('/proc/self/status')"
                " if l.startswith('VmHWM:')), file=sys.stderr, flush=True))\n")


def run_measured(code: str) -> tuple[str, int]:
    """Run Python ``code`` in a child; its output (the peak line taken out) and its peak RSS
    in bytes (VmHWM, written by the child itself as it exits)."""
    proc = subprocess.run([sys.executable, "-c", PEAK_AT_EXIT + code], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    lines = proc.stdout.splitlines()
    peaks = [int(line.split()[1]) for line in lines if line.startswith("PEAK_KB ")]
    out = "\n".join(line for line in lines if not line.startswith("PEAK_KB "))
    assert peaks, f"the child did not say its peak (exit {proc.returncode}): {out}"
    return out, peaks[-1] << 10


def consume_in_child(bootstrap: str, what: str) -> tuple[str, int]:
    """Run ``what`` (with ``c``, a bundled Consumer assigned to the bombed partition) in a child;
    its output and its peak RSS in bytes."""
    script = textwrap.dedent(f"""
        from odradek import Consumer, TopicPartition
        tp = TopicPartition({TOPIC!r}, 0)
        with Consumer({bootstrap!r}, auto_offset_reset="earliest") as c:
            c.assign([tp])
            try:
                {what}
            except Exception as exc:
                print("ERROR", type(exc).__name__, exc)
    """)
    return run_measured(script)


def test_a_lookup_by_timestamp_reads_only_the_records_header_of_a_bomb(bombed):
    fetch = actor(bombed, "fetch")
    reset_peak(fetch)
    before = peak_rss(fetch)
    out, _ = consume_in_child(bombed.bootstrap, "print(c.offsets_for_times({tp: 1000}))")
    assert "ERROR" not in out and ": 1}" in out, out  # the bomb's one record, at offset 1
    grown = peak_rss(fetch) - before
    assert grown < 16 * MiB, f"the fetch actor's peak grew by {grown / MiB:.0f} MiB"


def test_the_bundled_consumer_stops_at_the_bound_naming_the_batch(bombed):
    out, peak = consume_in_child(bombed.bootstrap, textwrap.dedent("""
        got = []
        for _ in range(40):
            got += [r.offset for r in c.poll(timeout_ms=250)]
        print(got)""").replace("\n", "\n                "))
    assert "ERROR MessageSizeTooLargeError" in out or "ERROR" in out, out
    assert f"{TOPIC}-0: batch at offset 1" in out and f"beyond {DEFAULT_LIMIT} bytes" in out, out
    assert peak < DEFAULT_LIMIT + 96 * MiB, f"the consumer peaked at {peak / MiB:.0f} MiB (the bomb: {BOMB_MIB} MiB)"


def test_the_console_browser_says_so_and_the_metrics_actor_stays_bounded(bombed):
    metrics = actor(bombed, "metrics")
    reset_peak(metrics)
    before = peak_rss(metrics)
    with urllib.request.urlopen(bombed.console_url + f"topics/{TOPIC}/messages?partition=0", timeout=120) as r:
        page = r.read().decode()
    assert f"beyond {DEFAULT_LIMIT} bytes" in page, page[-2000:]
    grown = peak_rss(metrics) - before
    assert grown < DEFAULT_LIMIT + 64 * MiB, f"the metrics actor's peak grew by {grown / MiB:.0f} MiB"


def test_dump_log_prints_the_bound_in_place_of_the_records(bombed):
    part = os.path.join(bombed.data_dir, f"{TOPIC}-0")
    path = os.path.join(part, sorted(f for f in os.listdir(part) if f.endswith(".log"))[0])
    out, peak = run_measured(f"import runpy, sys\nsys.argv = ['odradek', 'dump-log', {path!r}]\n"
                             f"runpy.run_module('odradek', run_name='__main__')")
    assert "payload: fine" in out, out
    assert f"beyond {DEFAULT_LIMIT} bytes" in out, out
    assert peak < DEFAULT_LIMIT + 96 * MiB, f"dump-log peaked at {peak / MiB:.0f} MiB"

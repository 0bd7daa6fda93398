"""The command line tools: topics, produce, consume (on a real broker) and dump-log (on files)."""
from __future__ import annotations

import os
import subprocess
import sys

from odradek.core import records as fmt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def odradek(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "odradek", *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=timeout)


def write_segment(path, tail: bytes = b"") -> None:
    a = bytearray(fmt.encode_batch([(b"k1", b"hello"), (None, b"world")], timestamp_ms=5))
    b = bytearray(fmt.encode_batch([(None, b"third")], timestamp_ms=6))
    fmt.patch_base_offset(b, 2)
    path.write_bytes(bytes(a) + bytes(b) + tail)


def test_dump_log_prints_batches_and_records_and_reports_a_zero_filled_tail(tmp_path):
    part = tmp_path / "t-0"
    part.mkdir()
    write_segment(part / "00000000000000000000.log", tail=bytes(512))
    out = odradek("dump-log", str(part))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    batches = [ln for ln in lines if ln.startswith("baseOffset:")]
    assert len(batches) == 2 and "count: 2" in batches[0] and "isValid: true" in batches[0]
    assert "position: 0" in batches[0] and "baseOffset: 2 lastOffset: 2" in batches[1]
    assert "| offset: 0 CreateTime: 5 keySize: 2 valueSize: 5 headerKeys: [] key: k1 payload: hello" in lines
    assert any("offset: 2" in ln and "payload: third" in ln for ln in lines)
    assert lines[-1].startswith("Found 512 zero-filled bytes at position")


def test_dump_log_flags_a_batch_whose_crc_does_not_match(tmp_path):
    seg = tmp_path / "00000000000000000000.log"
    write_segment(seg)
    data = bytearray(seg.read_bytes())
    data[fmt.HEADER_SIZE + 2] ^= 0xFF
    seg.write_bytes(bytes(data))
    out = odradek("dump-log", "--batches-only", str(seg))
    assert out.returncode == 0
    assert "isValid: false" in out.stdout.splitlines()[2] and "| offset" not in out.stdout


def test_a_missing_path_is_one_line_on_stderr_and_exit_1(tmp_path):
    out = odradek("dump-log", str(tmp_path / "nope"))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1 and "nope" in out.stderr


def test_topics_produce_and_consume_round_trip_with_keys(shared_broker):
    bs = ["--bootstrap-server", shared_broker.bootstrap]
    made = odradek("topics", "--create", "--topic", "cli", "--partitions", "2", "--config", "retention.ms=60000", *bs)
    assert made.returncode == 0, made.stderr
    assert "cli" in odradek("topics", "--list", *bs).stdout.split()
    described = odradek("topics", "--describe", "--topic", "cli", *bs).stdout
    assert "PartitionCount: 2" in described and "Configs: retention.ms=60000\n" in described  # overrides only
    sent = odradek("produce", "cli", "--key-separator", ":", "--partition", "1", *bs, stdin="a:1\nb:2\nc:3\n")
    assert sent.returncode == 0, sent.stderr
    got = odradek("consume", "cli", "--from-beginning", "--max-messages", "3", "--property", "print.key=true",
                  "--property", "key.separator=|", *bs)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ["a|1", "b|2", "c|3"]
    again = odradek("consume", "cli", "--partition", "1", "--offset", "2", "--max-messages", "1", *bs)
    assert again.stdout.splitlines() == ["3"]
    assert odradek("topics", "--delete", "--topic", "cli", *bs).returncode == 0
    gone = odradek("topics", "--describe", "--topic", "cli", *bs)
    assert gone.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in gone.stderr


def test_creating_an_existing_topic_is_one_line_naming_it(shared_broker):
    bs = ["--bootstrap-server", shared_broker.bootstrap]
    assert odradek("topics", "--create", "--topic", "dup", *bs).returncode == 0
    again = odradek("topics", "--create", "--topic", "dup", *bs)
    assert again.returncode == 1 and "dup" in again.stderr and "TOPIC_ALREADY_EXISTS" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert odradek("topics", "--create", "--topic", "dup", "--if-not-exists", *bs).returncode == 0

"""Responses naming file regions: written with sendfile after the frames, padded if short."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def file_tree(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("filetree"))
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "tests.network.filetree", run_dir], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready "), line
        yield int(line.split()[1])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert proc.returncode == 0


def fetch(port: int, files: list) -> tuple[dict, list[bytes]]:
    with BrokerConnection("127.0.0.1", port, request_timeout_ms=10000) as conn:
        resp = conn.request(ApiKey.FETCH, {"files": files})
        assert conn.request(ApiKey.PING, {"after": 1}).body == {"after": 1}  # stream still in step
    return resp.body, [bytes(f) for f in resp.frames]


def test_file_regions_follow_the_frames_byte_for_byte(file_tree, tmp_path):
    path = tmp_path / "segment.log"
    data = os.urandom(300_000)
    path.write_bytes(data)
    body, frames = fetch(file_tree, [[str(path), 10, 1000], [str(path), 50_000, 250_000]])
    assert body == {"regions": 2}
    assert frames == [b"frame-before-files", data[10:1010], data[50_000:300_000]]


def test_a_short_file_is_padded_with_zeros_to_the_promised_length(file_tree, tmp_path):
    path = tmp_path / "short.log"
    path.write_bytes(b"abcdef")
    _, frames = fetch(file_tree, [[str(path), 2, 10]])
    assert frames[1] == b"cdef" + bytes(6)


def test_a_missing_file_is_sent_as_zeros(file_tree, tmp_path):
    _, frames = fetch(file_tree, [[str(tmp_path / "gone.log"), 0, 5000]])
    assert frames[1] == bytes(5000)

"""/metrics as Prometheus' own tools take it (issue 29): ``promtool check metrics`` finds
nothing in a real broker's text, a real Prometheus scraping the broker answers every query
of the Grafana dashboard with a series, gzip when the scraper asks, counters at 0 from the
start, build info and per-actor CPU seconds. promtool and prometheus are Debian's
``prometheus`` package (``ensure_promtool`` in bin/_env.sh, run by bin/test)."""
from __future__ import annotations

import gzip
import json
import pathlib
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from odradek import Admin, Consumer, Producer
from tests.observability.conftest import http_get


@pytest.fixture(scope="module")
def shared_broker(module_broker):
    """A broker of this module's own, not the package's (tests/observability/conftest.py):
    counters at 0 before they move, and what promtool and Prometheus read, are of the
    whole broker."""
    return module_broker


ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMTOOL, PROMETHEUS = shutil.which("promtool"), shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(PROMTOOL is None or PROMETHEUS is None,
                                      reason="Debian's prometheus package is missing (bin/test installs it)")


class Traffic:
    """A producer and a subscribed consumer group working against ``bootstrap`` until stopped:
    what a healthy, used broker shows (produce and fetch latencies, a group and its lag)."""

    def __init__(self, bootstrap: str, topic: str, group: str):
        with Admin(bootstrap) as admin:
            admin.create_topic(topic, partitions=2)
        self.stop = threading.Event()
        self.errors: list = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (lambda: self._produce(bootstrap, topic), lambda: self._consume(bootstrap, topic, group))]
        for t in self.threads:
            t.start()

    def _guard(self, work) -> None:
        try:
            work()
        except Exception as exc:  # reported by the test, not lost in a thread
            self.errors.append(exc)

    def _produce(self, bootstrap: str, topic: str) -> None:
        producer = Producer(bootstrap, client_id="dash-producer")
        i = 0
        while not self.stop.is_set():
            producer.send(topic, key=b"k%d" % i, value=b"v" * 100)
            producer.flush()
            i += 1
            time.sleep(0.05)
        producer.close()

    def _consume(self, bootstrap: str, topic: str, group: str) -> None:
        consumer = Consumer(bootstrap, group_id=group, client_id="dash-consumer", auto_offset_reset="earliest",
                            enable_auto_commit=False)
        consumer.subscribe([topic])
        while not self.stop.is_set():
            if consumer.poll(200):
                consumer.commit()
        consumer.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not self.errors, self.errors


def metrics_text(broker) -> str:
    status, text = http_get(broker.console_url + "metrics")
    assert status == 200
    return text


def promtool_check(text: str) -> tuple[int, str]:
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).decode()


@needs_prometheus
def test_promtool_finds_nothing_in_a_used_brokers_metrics(shared_broker):
    traffic = Traffic(shared_broker.bootstrap, "promtool-checked", "promtool-readers")
    try:
        time.sleep(3)  # requests of every kind the clients make, a group with offsets
        code, findings = promtool_check(metrics_text(shared_broker))
    finally:
        traffic.close()
    assert (code, findings) == (0, "")


@needs_prometheus
def test_promtool_finds_nothing_with_per_partition_series(start_broker):
    broker = start_broker(metrics_partition_level="true")
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("per-partition", partitions=3)
    text = metrics_text(broker)
    assert 'odradek_log_end_offset{partition="2",topic="per-partition"}' in text
    assert promtool_check(text) == (0, "")


def test_metrics_are_gzipped_when_the_scraper_asks(shared_broker):
    url = shared_broker.console_url + "metrics"
    plain = metrics_text(shared_broker)
    for accept, zipped in (("gzip", True), ("deflate, gzip;q=0.5", True), ("gzip;q=0", False), ("identity", False)):
        req = urllib.request.Request(url, headers={"Accept-Encoding": accept})
        with urllib.request.urlopen(req, timeout=10) as r:
            body, encoding = r.read(), r.headers.get("Content-Encoding")
        assert (encoding == "gzip") == zipped, accept
        text = (gzip.decompress(body) if zipped else body).decode()
        assert text.startswith("# HELP") and "odradek_build_info" in text
        if zipped:
            assert len(body) * 3 < len(plain), (len(body), len(plain))


def test_counters_are_there_at_zero_before_they_move_and_build_and_process_metrics_too(shared_broker):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("quiet", partitions=1)
    deadline = time.monotonic() + 30
    while True:
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(metrics_text(shared_broker)) for s in fam.samples}
        if ("odradek_topic_bytes_in_total", (("topic", "quiet"),)) in samples or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert samples[("odradek_isr_shrinks_total", ())] == 0 and samples[("odradek_isr_expands_total", ())] == 0
    for name in ("bytes_in", "records_in", "bytes_out", "records_out", "replication_bytes_out"):
        assert samples[(f"odradek_topic_{name}_total", (("topic", "quiet"),))] == 0, name
    assert samples[("odradek_authentication_failures_total", (("listener", "PLAINTEXT"),))] == 0
    build = [labels for (name, labels), v in samples.items() if name == "odradek_build_info" and v == 1]
    assert len(build) == 1 and dict(build[0])["version"] and dict(build[0])["python"].count(".") == 2
    cpu = {dict(labels)["actor"]: v for (name, labels), v in samples.items() if name == "odradek_actor_cpu_seconds_total"}
    assert cpu.get("log-0", 0) > 0 and cpu.get("metrics", 0) > 0, cpu
    started = {dict(labels)["actor"]: v for (name, labels), v in samples.items()
               if name == "odradek_actor_start_time_seconds"}
    assert time.time() - 3600 < started["fetch"] < time.time()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((ROOT / "dashboards" / "odradek-broker.json").read_text())
    return [(p["title"], t["expr"].replace("$instance", ".*")) for p in dash["panels"] for t in p["targets"]]


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        answer = json.load(r)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@needs_prometheus
def test_a_real_prometheus_scraping_the_broker_answers_every_dashboard_query(shared_broker, tmp_path):
    target = urllib.parse.urlsplit(shared_broker.console_url).netloc
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: odradek\n    static_configs:\n      - targets: ['{target}']\n")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=log, stderr=subprocess.STDOUT)
    traffic = Traffic(shared_broker.bootstrap, "dashboarded", "dashboard-readers")
    try:
        missing = dashboard_queries()
        deadline = time.monotonic() + 120
        while missing and time.monotonic() < deadline:
            time.sleep(2)
            try:
                missing = [(title, expr) for title, expr in missing if not query(port, expr)]
            except OSError:  # Prometheus still starting
                continue
        up = query(port, 'up{job="odradek"}')
    finally:
        traffic.close()
        prometheus.terminate()
        prometheus.wait(30)
        log.close()
    assert up and up[0]["value"][1] == "1", (tmp_path / "prometheus.log").read_text()[-2000:]
    assert not missing, f"dashboard queries without a series: {missing}"
    # the per-topic panels label their series by topic (no per-partition label exists there)
    legends = json.loads((ROOT / "dashboards" / "odradek-broker.json").read_text())
    assert not re.search(r"\{\{partition\}\}", json.dumps(legends))

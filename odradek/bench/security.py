"""``odradek perf security``: what security costs (docs/BENCHMARKS.md, "Security").

Runs in the command's process and starts its own brokers (odradek.local.LocalBroker, ports
on 127.0.0.1, temporary directories, certificates made with ``openssl``):

1. one broker with a PLAINTEXT and a SASL_SSL listener: the bundled producer (acks=1) and
   consumer move the same records through each listener, alternating, ``--runs`` times;
   throughput medians side by side (TLS rules out sendfile, so the consumer's bytes are
   copied through the cipher);
2. the same produce against a broker with ``authorizer`` off, then one with it on and
   ``--acls`` ACLs defined (the producer's own ACL among them);
3. the handler's check alone (``network.guard.Guard.check`` of one produce request), off and
   on with ``--acls`` ACLs: a figure the shared machine's noise does not swamp.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid

from odradek import Admin, Consumer, Producer
from odradek.local import LocalBroker
from odradek.network import authorizer as az
from odradek.network import secstore
from odradek.types import TopicPartition

USER, PASSWORD = "bench", "bench-secret"


def _certs(d: str) -> tuple[str, str, str]:
    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=bench-ca", "-keyout", "ca.key",
        "-out", "ca.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "b.key", "-out", "b.csr")
    with open(os.path.join(d, "b.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "b.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
        "-out", "b.pem", "-extfile", "b.ext")
    return tuple(os.path.join(d, n) for n in ("ca.pem", "b.pem", "b.key"))


def _listeners(broker: LocalBroker) -> dict:
    import re
    out = {}
    for line in broker.stdout_lines:
        m = re.search(r"odradek listener (\S+) on (\S+):(\d+)", line)
        if m:
            out[m.group(1)] = f"{m.group(2)}:{m.group(3)}"
    return out


def _produce(bootstrap: str, topic: str, n: int, size: int, security: dict) -> float:
    value = os.urandom(size)  # the topic is new: created first, then one record, then the timed ones
    with Admin(bootstrap, **security) as admin:
        admin.create_topic(topic)
    with Producer(bootstrap, acks=1, linger_ms=5, **security) as p:
        p.send(topic, value).get(30)  # metadata and connections first
        began = time.perf_counter()
        for _ in range(n):
            p.send(topic, value)
        p.flush(120)
        return n * size / (time.perf_counter() - began) / 1e6


def _consume(bootstrap: str, topic: str, n: int, size: int, security: dict) -> float:
    with Consumer(bootstrap, auto_offset_reset="earliest", **security) as c:
        c.assign([TopicPartition(topic, 0)])
        got, began = 0, time.perf_counter()
        deadline = began + 120
        while got < n and time.perf_counter() < deadline:
            got += len(c.poll(500, max_records=100000))
        return got * size / (time.perf_counter() - began) / 1e6


def _acl_lists(count: int) -> list:
    acls = [az.Acl.make(f"User:u{i}", "Topic", f"t{i}-", "Write", pattern="Prefixed").as_list()
            for i in range(count - 2)]
    return acls + [az.Acl.make("User:ANONYMOUS", "Topic", "bench-", op, pattern="Prefixed").as_list()
                   for op in ("Write", "Create")]


def _check_cost(base: str, count: int, runs: int) -> None:
    from odradek.network.guard import Guard
    from odradek.actors.messages import Request
    from odradek.core.protocol import ApiKey
    data = os.path.join(base, "check")
    os.makedirs(data)
    secstore.Acls(data).add(_acl_lists(count))
    body = {"acks": 1, "topics": [{"name": "bench-abc", "partitions": [{"index": 0, "frame": 0}]}]}
    fields = Request(ApiKey.PRODUCE, 0, None, 1, "127.0.0.1:5555", body, 0.0, "User:ANONYMOUS", "PLAINTEXT", None)
    for label, guard in (("check, authorizer off", Guard({}, data)),
                         (f"check, on, {count} ACLs", Guard({"authorizer": True}, data))):
        per = []
        for _ in range(runs):
            began = time.perf_counter()
            for _ in range(100000):
                guard.check(fields, ApiKey.PRODUCE, body)
            per.append((time.perf_counter() - began) / 100000 * 1e6)
        print(f"{label:28s} {statistics.median(per):6.2f} us per produce request "
              f"(runs {', '.join(f'{x:.2f}' for x in per)})")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="odradek perf security", description=__doc__)
    ap.add_argument("--num-records", type=int, default=100000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--acls", type=int, default=1000)
    ap.add_argument("--check-only", action="store_true", help="only the handler's check (no broker)")
    args = ap.parse_args(argv)
    n, size = args.num_records, args.record_size
    base = tempfile.mkdtemp(prefix="odradek-secbench-")
    try:
        _check_cost(base, args.acls, args.runs)
        if args.check_only:
            return 0
        ca, cert, key = _certs(base)
        data = os.path.join(base, "tls")
        os.makedirs(data)
        secstore.Users(data).add(USER, PASSWORD, iterations=4096)
        broker = LocalBroker(data, {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                                    "ssl.certfile": cert, "ssl.keyfile": key}, start_timeout=240).start()
        try:
            addr = _listeners(broker)
            sec = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": USER,
                   "sasl_plain_password": PASSWORD, "ssl_cafile": ca}
            results = {"PLAINTEXT": ([], []), "SASL_SSL": ([], [])}
            for _ in range(args.runs):
                for name, security in (("PLAINTEXT", {}), ("SASL_SSL", sec)):
                    topic = f"bench-{uuid.uuid4().hex[:8]}"
                    results[name][0].append(_produce(addr[name], topic, n, size, security))
                    results[name][1].append(_consume(addr[name], topic, n, size, security))
            for name, (prod, cons) in results.items():
                print(f"{name:10s} produce {statistics.median(prod):7.1f} MB/s (runs {', '.join(f'{x:.1f}' for x in prod)})"
                      f"   consume {statistics.median(cons):7.1f} MB/s (runs {', '.join(f'{x:.1f}' for x in cons)})")
        finally:
            broker.stop()
        for label, authorizer in (("authorizer off", False), (f"authorizer on, {args.acls} ACLs", True)):
            data = os.path.join(base, f"acl-{authorizer}")
            os.makedirs(data)
            if authorizer:
                secstore.Acls(data).add(_acl_lists(args.acls))
            broker = LocalBroker(data, {"authorizer": authorizer}, start_timeout=240).start()
            try:
                runs = [_produce(broker.bootstrap, f"bench-{uuid.uuid4().hex[:8]}", n, size, {})
                        for _ in range(args.runs)]
            finally:
                broker.stop()
            print(f"{label:28s} produce {statistics.median(runs):7.1f} MB/s (runs {', '.join(f'{x:.1f}' for x in runs)})")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0

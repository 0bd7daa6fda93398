"""Kafka's command-line habits (issue 28 part 3), each run as a user runs it (a subprocess)
against one broker with every kind of listener (``secure_broker``): the tools reach its
SASL_SSL listener through a Kafka client properties file (``--command-config``,
``--producer.config``, ``--consumer.config``; no password on the command line), kcat through
``-X`` options; Kafka's topic, produce, consume and group options; ``perf --help``; a closed
pipe; a port already taken."""
from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.security.fixtures import USERS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def odradek(*args: str, stdin: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "odradek", *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=timeout)


def ok(*args: str, stdin: str | None = None) -> str:
    out = odradek(*args, stdin=stdin)
    assert out.returncode == 0, f"odradek {' '.join(args)}: {out.stderr}"
    return out.stdout


def addr(broker, listener: str) -> str:
    host, port, _ = broker.listeners[listener]
    return f"{host}:{port}"


@pytest.fixture(scope="module")
def sasl_ssl(secure_broker, certs, tmp_path_factory) -> dict:
    """The SASL_SSL bootstrap and a Kafka client properties file for alice (PEM truststore)."""
    d = tmp_path_factory.mktemp("client-config")
    path = d / "client.properties"
    path.write_text("# Kafka client properties, as kafka-topics --command-config takes them\n"
                    "security.protocol=SASL_SSL\n"
                    "sasl.mechanism=SCRAM-SHA-512\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
                    f"    username=\"alice\" password=\"{USERS['alice']}\";\n"
                    f"ssl.truststore.location={certs['ca']}.pem\n"
                    "ssl.truststore.type=PEM\n")
    os.chmod(path, 0o600)
    rdkafka = d / "librdkafka.properties"  # librdkafka's spelling of the same
    rdkafka.write_text(f"security.protocol=sasl_ssl\nsasl.mechanisms=SCRAM-SHA-256\nsasl.username=bob\n"
                       f"sasl.password={USERS['bob']}\nssl.ca.location={certs['ca']}.pem\n")
    wrong = d / "wrong.properties"
    wrong.write_text(path.read_text().replace(USERS["alice"], "not-the-password"))
    return {"bs": ["--bootstrap-server", addr(secure_broker, "SASL_SSL")], "file": str(path),
            "rdkafka": str(rdkafka), "wrong": str(wrong)}


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ---- --command-config on every tool, against SASL_SSL --------------------------------------------

def test_every_tool_reaches_a_sasl_ssl_listener_through_a_client_properties_file(sasl_ssl):
    bs, cc = sasl_ssl["bs"], ["--command-config", sasl_ssl["file"]]
    topic, group = name("sec"), name("secg")
    assert "Created topic" in ok("topics", "--create", "--topic", topic, "--partitions", "2", *bs, *cc)
    assert topic in ok("topics", "--list", *bs, *cc).split()
    assert "now has 3 partitions" in ok("topics", "--alter", "--topic", topic, "--partitions", "3", *bs, *cc)
    assert "PartitionCount: 3" in ok("topics", "--describe", "--topic", topic, *bs, *cc)
    ok("produce", "--topic", topic, "--producer.config", sasl_ssl["file"], "--partition", "0", *bs,
       stdin="one\ntwo\nthree\n")
    got = ok("consume", "--topic", topic, "--consumer.config", sasl_ssl["file"], "--from-beginning",
             "--max-messages", "3", "--group", group, "--isolation-level", "read_committed", *bs)
    assert got.split() == ["one", "two", "three"]
    listed = ok("groups", "--list", *bs, *cc)
    assert group in listed
    assert "CURRENT-OFFSET" in ok("groups", "--describe", group, *bs, *cc)
    assert "Valid replica already elected" in ok("leader-election", "--topic", topic, *bs, *cc)
    ok("reassign", "--list", *bs, *cc)
    assert "Configs for broker" in ok("configs", "--describe", *bs, *cc)
    ok("transactions", *bs, *cc, "list")
    # librdkafka's names in the file work too (another user, another mechanism)
    assert topic in ok("topics", "--list", *bs, "--command-config", sasl_ssl["rdkafka"]).split()
    # a wrong password: one line naming the failure, exit 1, no traceback
    bad = odradek("topics", "--list", *bs, "--command-config", sasl_ssl["wrong"])
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "Traceback" not in bad.stderr and "SASL_AUTHENTICATION_FAILED" in bad.stderr
    missing = odradek("topics", "--list", *bs, "--command-config", "/nonexistent/client.properties")
    assert missing.returncode == 1 and "cannot read the client properties file" in missing.stderr
    assert "Deleted topic" in ok("topics", "--delete", "--topic", topic, *bs, *cc)


def test_kcat_with_x_security_options_produces_and_consumes_on_the_same_sasl_ssl_listener(secure_broker, certs,
                                                                                         sasl_ssl):
    kcat = shutil.which("kcat")
    assert kcat, "kcat is not installed: bin/test installs it (ensure_kcat in bin/_env.sh)"
    topic = name("kcat")
    ok("topics", "--create", "--topic", topic, *sasl_ssl["bs"], "--command-config", sasl_ssl["file"])
    # PLAIN over TLS: kcat's librdkafka (2.0.2 on Debian) sends a SCRAM client-final whose nonce
    # repeats the client's part ("r=<client><client><server>"), which Kafka refuses as Odradek does
    x = ["-b", addr(secure_broker, "SASL_SSL"), "-X", "security.protocol=SASL_SSL", "-X",
         "sasl.mechanisms=PLAIN", "-X", "sasl.username=bob", "-X", f"sasl.password={USERS['bob']}",
         "-X", f"ssl.ca.location={certs['ca']}.pem"]
    meta = subprocess.run([kcat, *x, "-L", "-t", topic], capture_output=True, text=True, timeout=60)
    assert meta.returncode == 0 and f'topic "{topic}"' in meta.stdout, meta.stderr
    sent = subprocess.run([kcat, *x, "-P", "-t", topic, "-p", "0"], input="k1\nk2\n", capture_output=True,
                          text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    got = subprocess.run([kcat, *x, "-C", "-t", topic, "-o", "beginning", "-c", "2", "-e"], capture_output=True,
                         text=True, timeout=60)
    assert got.stdout.split() == ["k1", "k2"], got.stderr
    # and what kcat wrote, odradek's consumer reads through the properties file
    assert ok("consume", "--topic", topic, "--command-config", sasl_ssl["file"], "--from-beginning",
              "--max-messages", "2", *sasl_ssl["bs"]).split() == ["k1", "k2"]
    wrong = subprocess.run([kcat, *x[:-4], "-X", "sasl.password=wrong", "-X", f"ssl.ca.location={certs['ca']}.pem",
                            "-L", "-m", "5"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0 and "SASL authentication error" in wrong.stderr, wrong.stderr


# ---- topics ---------------------------------------------------------------------------------------

def test_topics_options_as_kafka_topics_has_them(secure_broker):
    bs = ["--bootstrap-server", addr(secure_broker, "PLAINTEXT")]
    stem = name("rx")
    for suffix in ("a", "b"):
        ok("topics", "--create", "--topic", f"{stem}.{suffix}", "--partitions", "1", *bs)
    ok("groups", "--list", *bs)  # nothing to show; the internal topics exist once a group or commit ran
    group = name("g")
    ok("produce", "--topic", f"{stem}.a", *bs, stdin="r\n")
    ok("consume", "--topic", f"{stem}.a", "--group", group, "--from-beginning", "--max-messages", "1", *bs)
    listed = ok("topics", "--list", *bs).split()
    assert "__consumer_offsets" in listed  # internal topics are listed, as Kafka's tool does
    assert "__consumer_offsets" not in ok("topics", "--list", "--exclude-internal", *bs).split()
    assert ok("topics", "--list", "--topic", f"{stem}\\..*", *bs).split() == [f"{stem}.a", f"{stem}.b"]
    described = ok("topics", "--describe", "--topic", f"{stem}.*", *bs)
    assert described.count("PartitionCount: 1") == 2
    assert ok("topics", "--describe", "--under-replicated-partitions", *bs) == ""  # one broker: ISR = replicas
    assert "Topic " in ok("topics", "--alter", "--topic", f"{stem}\\.a", "--partitions", "4", *bs)
    assert "PartitionCount: 4" in ok("topics", "--describe", "--topic", f"{stem}.a", *bs)
    fewer = odradek("topics", "--alter", "--topic", f"{stem}.a", "--partitions", "2", *bs)
    assert fewer.returncode == 1 and "INVALID_PARTITIONS" in fewer.stderr
    missing = odradek("topics", "--delete", "--topic", "no-such-topic", *bs)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert odradek("topics", "--delete", "--topic", "no-such-topic", "--if-exists", *bs).returncode == 0
    assert odradek("topics", "--describe", "--topic", "no-such-topic", "--if-exists", *bs).stdout == ""
    ok("topics", "--delete", "--topic", f"{stem}\\..*", *bs)
    assert not [t for t in ok("topics", "--list", *bs).split() if t.startswith(stem)]
    # the group's offsets of a deleted topic stay committed: described, without a log end
    gone = ok("groups", "--describe", group, *bs)
    assert any(line.split()[:3] == [f"{stem}.a", "0", "1"] and line.split()[3] == "-" for line in gone.splitlines())


# ---- produce: every codec -------------------------------------------------------------------------------

def test_produce_offers_every_kafka_codec_and_kafka_consumers_read_them(secure_broker):
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition as KTP
    bs = ["--bootstrap-server", addr(secure_broker, "PLAINTEXT")]
    topic = name("codec")
    ok("topics", "--create", "--topic", topic, "--partitions", "1", *bs)
    codecs = ("none", "gzip", "snappy", "lz4", "zstd")
    for codec in codecs:
        ok("produce", "--topic", topic, "--compression-codec", codec, "--key-separator", ":", *bs,
           stdin=f"{codec}:1-{codec}\n{codec}:2-{codec}\n")
    got = ok("consume", "--topic", topic, "--from-beginning", "--max-messages", "10", "--property", "print.key=true",
             "--property", "key.separator=:", *bs)
    assert got.split() == [f"{c}:{i}-{c}" for c in codecs for i in (1, 2)]
    c = KafkaConsumer({"bootstrap.servers": bs[1], "group.id": name("cg"), "enable.auto.commit": False})
    try:
        c.assign([KTP(topic, 0, 0)])
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 10 and time.monotonic() < deadline:
            m = c.poll(1)
            if m is not None and not m.error():
                seen.append((m.key().decode(), m.value().decode()))
        assert seen == [(cd, f"{i}-{cd}") for cd in codecs for i in (1, 2)]
    finally:
        c.close()
    dumped = ok("dump-log", "--batches-only", os.path.join(secure_broker.data_dir, f"{topic}-0"))
    # each codec's two lines are one batch, or two when the producer's linger ends between them (a loaded machine)
    batches = [ln.split("compresscodec: ")[1].split()[0] for ln in dumped.splitlines() if "compresscodec" in ln]
    assert [codec for codec, _ in itertools.groupby(batches)] == ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD"], batches


# ---- consume: group, isolation, properties -------------------------------------------------------------

def test_consume_in_a_group_commits_and_resumes_where_it_stopped(secure_broker):
    bs = ["--bootstrap-server", addr(secure_broker, "PLAINTEXT")]
    topic, group = name("cg"), name("grp")
    ok("topics", "--create", "--topic", topic, "--partitions", "1", *bs)
    ok("produce", "--topic", topic, "--producer-property", "acks=all", "--producer-property", "linger.ms=0", *bs,
       stdin="".join(f"m{i}\n" for i in range(6)))
    brotli = odradek("produce", "--topic", topic, "--producer-property", "compression.type=brotli", *bs, stdin="x\n")
    assert brotli.returncode == 1 and "'brotli' is not supported" in brotli.stderr
    first = ok("consume", "--topic", topic, "--group", group, "--max-messages", "4", "--consumer-property",
               "auto.offset.reset=earliest", *bs)
    assert first.split() == ["m0", "m1", "m2", "m3"]
    rest = ok("consume", "--topic", topic, "--group", group, "--max-messages", "2", *bs)
    assert rest.split() == ["m4", "m5"]
    state = ok("groups", "--describe", group, "--state", *bs)
    assert "Empty" in state and "STATE" in state
    # reset: --to-offset, --to-current (a dry run shows the plan), --by-duration
    assert " 1\n" in ok("groups", "--reset-offsets", group, "--topic", topic, "--to-offset", "1", "--execute", *bs)
    assert ok("consume", "--topic", topic, "--group", group, "--max-messages", "1", *bs).split() == ["m1"]
    plan = ok("groups", "--reset-offsets", group, "--topic", topic, "--to-current", *bs)
    assert "dry run" in plan and plan.splitlines()[1].split()[-2:] == ["2", "2"]
    back = ok("groups", "--reset-offsets", group, "--topic", topic, "--by-duration", "P1D", "--execute", *bs)
    assert back.splitlines()[1].split()[-1] == "0"  # a day ago: before every record
    bad = odradek("groups", "--reset-offsets", group, "--topic", topic, "--by-duration", "1 day", *bs)
    assert bad.returncode == 1 and "ISO-8601" in bad.stderr
    everyone = ok("groups", "--describe", "--all-groups", "--state", *bs)
    assert group in everyone
    assert f"{group}\tEmpty" in ok("groups", "--list", "--state", "Empty", *bs)
    assert group not in ok("groups", "--list", "--state", "Stable", *bs)


def test_group_members_and_states_are_spelled_as_kafka_spells_them(secure_broker):
    bs = ["--bootstrap-server", addr(secure_broker, "PLAINTEXT")]
    topic, group = name("mem"), name("mg")
    ok("topics", "--create", "--topic", topic, "--partitions", "2", *bs)
    env = dict(os.environ, PYTHONPATH=ROOT)
    member = subprocess.Popen([sys.executable, "-m", "odradek", "consume", "--topic", topic, "--group", group, *bs],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        members = ""
        while time.monotonic() < deadline:  # the consumer starts and joins (GROUP_ID_NOT_FOUND before)
            members = odradek("groups", "--describe", group, "--members", *bs).stdout
            if "odradek-consume" in members:
                break
            time.sleep(0.5)
        assert "CONSUMER-ID" in members and "#PARTITIONS" in members and "odradek-consume" in members
        assert members.splitlines()[1].split()[-1] == "2"
        assert f"{group}\tStable" in ok("groups", "--list", *bs)
    finally:
        member.terminate()
        member.wait(30)


# ---- perf --help, a closed pipe, a port in use ---------------------------------------------------------

def test_perf_help_lists_the_benchmarks():
    out = odradek("perf", "--help")
    assert out.returncode == 0 and "produce" in out.stdout and "odradek perf TEST --help" in out.stdout


def test_output_piped_to_head_ends_quietly(secure_broker):
    bs = ["--bootstrap-server", addr(secure_broker, "PLAINTEXT")]
    topic = name("pipe")
    ok("topics", "--create", "--topic", topic, *bs)
    ok("produce", "--topic", topic, *bs, stdin="x" * 2000 + "\n" * 1 + "".join(f"{i}\n" for i in range(20000)))
    env = dict(os.environ, PYTHONPATH=ROOT)
    shell = (f"{sys.executable} -m odradek consume --topic {topic} --from-beginning --max-messages 20001 "
             f"--bootstrap-server {bs[1]} | head -1")
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.startswith("xxxx") and len(out.stdout.splitlines()) == 1
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr


def test_serve_on_a_port_in_use_fails_at_once_with_one_line(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        started = time.monotonic()
        out = odradek("serve", "--set", f"listeners=PLAINTEXT://127.0.0.1:{port}", "--set",
                      f"log.dirs={tmp_path / 'data'}", timeout=60)
        assert out.returncode == 1 and time.monotonic() - started < 20
        assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
        assert f"127.0.0.1:{port} is already in use" in out.stderr and "restart" not in out.stderr
    finally:
        taken.close()


# ---- groups --delete-offsets (OffsetDelete) -------------------------------------------------------------

def test_delete_offsets_of_a_group_with_the_tool_and_kafka_python(secure_broker):
    from kafka import KafkaAdminClient
    from kafka import errors as kerrors
    from kafka.structs import TopicPartition as KTopicPartition
    bs = ["--bootstrap-server", addr(secure_broker, "PLAINTEXT")]
    topic, group = name("do"), name("dog")
    ok("topics", "--create", "--topic", topic, "--partitions", "3", *bs)
    for p in range(3):
        ok("produce", "--topic", topic, "--partition", str(p), *bs, stdin="a\nb\n")
    ok("consume", "--topic", topic, "--group", group, "--from-beginning", "--max-messages", "6", *bs)
    out = ok("groups", "--delete-offsets", group, "--topic", f"{topic}:0", *bs)
    assert "Successful" in out and len(out.strip().splitlines()) == 2
    rows = {ln.split()[1]: ln.split() for ln in ok("groups", "--describe", group, *bs).splitlines()
            if ln.startswith(topic)}
    assert "0" not in rows and rows["1"][2] == "2" and rows["2"][2] == "2"  # an empty group: its commits only
    kadmin = KafkaAdminClient(bootstrap_servers=bs[1], request_timeout_ms=60000)
    try:
        got = kadmin.delete_group_offsets(group, [KTopicPartition(topic, 1)])
        assert got == {KTopicPartition(topic, 1): kerrors.NoError}
        with pytest.raises(kerrors.GroupIdNotFoundError):
            kadmin.delete_group_offsets(name("nobody"), [KTopicPartition(topic, 1)])
    finally:
        kadmin.close()
    assert [ln.split()[1:3] for ln in ok("groups", "--describe", group, *bs).splitlines()
            if ln.startswith(topic)] == [["2", "2"]]
    # while a member subscribes to the topic: refused per partition, as Kafka
    env = dict(os.environ, PYTHONPATH=ROOT)
    member = subprocess.Popen([sys.executable, "-m", "odradek", "consume", "--topic", topic, "--group", group, *bs],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while "odradek-consume" not in odradek("groups", "--describe", group, "--members", *bs).stdout:
            assert time.monotonic() < deadline, "the member did not join"
            time.sleep(0.5)
        refused = odradek("groups", "--delete-offsets", group, "--topic", topic, *bs)
        assert refused.returncode == 1 and "GROUP_SUBSCRIBED_TO_TOPIC" in refused.stdout + refused.stderr
    finally:
        member.terminate()
        member.wait(30)


"""Configuration: Kafka names, strict checks, TOML both ways, --set, the doc in step."""
import os
import subprocess
import sys

import pytest

from odradek.core.protocol import ErrorCode
from odradek import config as cfg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_defaults_serve_out_of_the_box_on_loopback():
    c = cfg.load()
    assert cfg.parse_listener(c["listeners"]) == ("127.0.0.1", 9092)
    assert c["num.io.threads"] >= 1 and c["log.dirs"] == "./odradek-data"


def test_toml_accepts_quoted_flat_keys_and_nested_tables(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text('"broker.id" = 3\n[num.io]\nthreads = 5\n[log]\ndirs = "/x"\n')
    c = cfg.load(str(path), ["num.network.threads=4"])
    assert (c["broker.id"], c["num.io.threads"], c["log.dirs"], c["num.network.threads"]) == (3, 5, "/x", 4)


@pytest.mark.parametrize("overrides, words", [
    (["num.io.thread=3"], ["unknown setting 'num.io.thread'", "did you mean 'num.io.threads'"]),
    (["num.io.threads=many"], ["'num.io.threads' expects int", "'many'"]),
    (["num.io.threads=0"], ["'num.io.threads' = 0", "from 1 to 64"]),
    (["listeners=SSL://h:1"], ["SSL", "'ssl.certfile'"]),
    (["listeners=TLS://h:1"], ["'listeners'", "listener.security.protocol.map"]),
    (["listeners=PLAINTEXT://host"], ["'listeners'", "PLAINTEXT://host:port"]),
    (["log.level=LOUD"], ["'log.level'", "DEBUG"]),
    (["num.io.threads"], ["--set expects key=value"]),
])
def test_bad_settings_are_refused_with_a_message_naming_them(overrides, words):
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(None, overrides)
    assert err.value.code == ErrorCode.INVALID_CONFIG
    for w in words:
        assert w in err.value.message


def test_a_wrongly_typed_toml_value_and_a_broken_file_are_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('"num.io.threads" = "4"\n')
    with pytest.raises(cfg.ConfigError, match="'num.io.threads' expects int"):
        cfg.load(str(bad))
    broken = tmp_path / "broken.toml"
    broken.write_text("num.io.threads = = 4\n")
    with pytest.raises(cfg.ConfigError, match="not valid TOML"):
        cfg.load(str(broken))
    with pytest.raises(cfg.ConfigError, match="does not exist"):
        cfg.load(str(tmp_path / "missing.toml"))


def test_run_dir_is_short_enough_for_unix_sockets_and_deterministic():
    long_dir = "/tmp/" + "x" * 150
    c = cfg.load(None, [f"log.dirs={long_dir}"])
    assert len(cfg.run_dir(c)) <= 80 and cfg.run_dir(c) == cfg.run_dir(dict(c))
    assert cfg.run_dir(cfg.load(None, ["log.dirs=/srv/od"])) == "/srv/od/run"


def test_config_doc_lists_every_setting_with_its_default():
    with open(os.path.join(ROOT, "docs", "CONFIG.md")) as f:
        doc = f.read()
    assert cfg.markdown_table() in doc, "docs/CONFIG.md is stale: regenerate with python -m odradek.config"


def test_serve_with_a_bad_setting_exits_1_naming_it_and_starts_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "odradek", "serve", "--set", "num.io.threads=-2",
                           "--set", f"log.dirs={tmp_path}"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1
    assert "num.io.threads" in proc.stderr and "INVALID_CONFIG" in proc.stderr
    assert not os.path.exists(tmp_path / "run")


def test_status_without_a_running_broker_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "odradek", "status", "--set", f"log.dirs={tmp_path}"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1 and "no broker is running" in proc.stderr


def test_every_kafka_broker_config_is_accepted_with_a_warning_and_checked_as_kafka(tmp_path, caplog):
    """Kafka 3.x's server.properties names (odradek/kafka_configs.py, from Kafka's docs): a
    name Odradek does not implement is kept, with a warning naming it, not refused."""
    from odradek.kafka_configs import BROKER_CONFIGS
    toml = tmp_path / "kafka.toml"
    toml.write_text('"num.replica.fetchers" = 4\n"log.preallocate" = false\n'
                    '"log.message.timestamp.difference.max.ms" = 1000\n[compression]\ntype = "zstd"\n')
    with caplog.at_level("WARNING", logger="odradek.config"):
        c = cfg.load(str(toml), ["background.threads=12", "sasl.kerberos.service.name=kafka"])
    assert (c["num.replica.fetchers"], c["log.preallocate"], c["compression.type"]) == ("4", "false", "zstd")
    assert c["background.threads"] == "12"
    warned = caplog.text
    assert "'background.threads' is accepted as Kafka does, but has no effect" in warned
    assert "'log.message.timestamp.difference.max.ms' is accepted as Kafka does (deprecated in Kafka)" in warned
    assert len(BROKER_CONFIGS) > 300 and {"zookeeper.connect", "log.dirs", "listeners"} <= set(BROKER_CONFIGS)
    for bad, words in [("compression.type=brotli", "compression.type"), ("num.recovery.threads.per.data.dir=0",
                                                                          "from 1"),
                       ("log.preallocate=maybe", "not a valid boolean")]:
        with pytest.raises(cfg.ConfigError, match=words):
            cfg.load(None, [bad])

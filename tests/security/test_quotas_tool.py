"""The quota settings without a broker: ``odradek configs --entity-type users|clients|ips``
and the broker-wide sharing of a quota between processors (network/quotas.py)."""
from __future__ import annotations

import types

import pytest

from odradek.cli import main
from odradek.network import quotas, secstore


@pytest.fixture
def configs(capsys):
    """``odradek configs --set log.dirs=DIR ARGS...`` in this process: its exit code and output."""
    def run(data_dir, *args: str):
        code = main(["configs", "--set", f"log.dirs={data_dir}", *args])
        out, err = capsys.readouterr()
        return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return run


def test_the_configs_tool_sets_request_and_address_quotas_and_refuses_what_does_not_fit(tmp_path, configs):
    out = configs(tmp_path, "--entity-type", "ips", "--entity-default", "--alter",
                  "--add-config", "connection_creation_rate=3")
    assert out.returncode == 0, out.stderr
    out = configs(tmp_path, "--entity-type", "users", "--entity-name", "alice", "--alter",
                  "--add-config", "request_percentage=50,producer_byte_rate=1000")
    assert out.returncode == 0, out.stderr
    assert secstore.Quotas(str(tmp_path)).data() == {
        "ips": {"<default>": {"connection_creation_rate": 3}},
        "users": {"alice": {"request_percentage": 50, "producer_byte_rate": 1000}}}
    described = configs(tmp_path, "--entity-type", "ips", "--describe").stdout
    assert "Quotas for ips '<default>': connection_creation_rate=3" in described
    for args, words in [
        (("--entity-type", "ips", "--entity-name", "10.0.0.7", "--add-config", "producer_byte_rate=5"),
         "expected connection_creation_rate=N"),
        (("--entity-type", "ips", "--entity-name", "not-an-address", "--add-config", "connection_creation_rate=5"),
         "is not an IP address"),
        (("--entity-type", "clients", "--entity-name", "c", "--add-config", "request_percentage=lots"),
         "request_percentage=N"),
    ]:
        out = configs(tmp_path, "--alter", *args)
        assert out.returncode != 0 and words in out.stderr, out.stderr
    assert "10.0.0.7" not in str(secstore.Quotas(str(tmp_path)).data())  # nothing half written


def test_two_processors_usage_is_charged_to_one_broker_wide_quota(tmp_path):
    secstore.Quotas(str(tmp_path)).set("clients", "c", "producer_byte_rate", 1000)  # burst: 200 bytes
    a, b, ledger = quotas.Quotas({}, str(tmp_path)), quotas.Quotas({}, str(tmp_path)), quotas.Ledger()
    now = 100.0  # the clock stands still: nothing refills
    assert a.delay("User:ANONYMOUS", "c", "produce", 200, now) == 0  # each within its own copy
    assert b.delay("User:ANONYMOUS", "c", "produce", 200, now) == 0
    a.synced(ledger.charge(a.report(), now), now)
    b.synced(ledger.charge(b.report(), now), now)  # the broker-wide bucket is 200 bytes over
    assert b.delay("User:ANONYMOUS", "c", "produce", 100, now) == pytest.approx(0.3)
    assert a.delay("User:ANONYMOUS", "c", "produce", 100, now) == pytest.approx(0.1)  # a has not heard yet
    a.synced(ledger.charge(a.report(), now), now)  # now it has: 200 + 100 (a) over; b's 100 not yet reported
    assert a.delay("User:ANONYMOUS", "c", "produce", 0, now) == pytest.approx(0.3)
    assert a.report() == [] and b.report() == [["User:ANONYMOUS", "c", "produce", 1000, 100]]

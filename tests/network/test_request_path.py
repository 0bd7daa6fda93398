"""The request path on a real broker: client -> acceptor hand-off -> processor -> handler."""
from __future__ import annotations

import pytest

from odradek.network.client import parse_bootstrap
from odradek.network.handler import SUPPORTED
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

from tests.network.helpers import actors_of, connect, raw_request, raw_socket, read_responses, wait_until


def test_api_versions_lists_every_supported_api(shared_broker):
    broker = shared_broker
    with connect(broker) as conn:
        body = conn.api_versions()
    got = {a["api_key"]: (a["min_version"], a["max_version"]) for a in body["api_keys"]}
    assert got == {int(k): v for k, v in SUPPORTED.items()}


def test_metadata_names_this_broker_at_its_bound_address(shared_broker):
    broker = shared_broker
    with connect(broker) as conn:
        body = conn.metadata()
    assert body["brokers"] == [{"node_id": 0, "host": broker.host, "port": broker.port}]
    assert body["controller_id"] == 0 and body["cluster_id"] == "odradek" and body["topics"] == []


def test_metadata_answers_unknown_topics_with_a_per_topic_error(shared_broker):
    broker = shared_broker
    with connect(broker) as conn:
        body = conn.metadata(["nope", "neither"])
    assert [(t["name"], t["error_code"]) for t in body["topics"]] == [
        ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), ("neither", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]


def test_ping_echoes_its_body_and_payload_frames(shared_broker):
    broker = shared_broker
    payload = bytes(range(256)) * 1000
    with connect(broker) as conn:
        resp = conn.request(ApiKey.PING, {"hello": [1, 2]}, [b"a", payload, b""])
        assert resp.body == {"hello": [1, 2]}
        assert [bytes(f) for f in resp.frames] == [b"a", payload, b""]


def test_empty_payload_frames_do_not_stall_the_connection(shared_broker):
    with connect(shared_broker) as conn:
        for frames in ([b""], [b"", b""], [b"", b"x", b""]):
            resp = conn.request(ApiKey.PING, {}, frames, timeout=10)
            assert [bytes(f) for f in resp.frames] == frames
        assert conn.request(ApiKey.PING, {"after": 1}, timeout=10).body == {"after": 1}


def test_pipelined_requests_are_answered_in_request_order(start_broker):
    broker = start_broker(num_io_threads=3)
    sock = raw_socket(broker)
    sock.sendall(b"".join(raw_request(ApiKey.PING, corr, {"i": corr}) for corr in range(1, 301)))
    responses, closed = read_responses(sock, 300)
    sock.close()
    assert not closed
    assert [r.corr for r in responses] == list(range(1, 301))
    assert [r.body["i"] for r in responses] == list(range(1, 301))


def test_connections_are_spread_over_processors_and_handlers(start_broker):
    broker = start_broker(num_network_threads=2, num_io_threads=2)
    conns = [connect(broker) for _ in range(8)]
    try:
        for c in conns:
            for _ in range(5):
                c.request(ApiKey.PING, {})

        def spread():
            procs = actors_of(broker, "processor")
            handlers = actors_of(broker, "handler")
            return all(p["processed"] for p in procs) and all(h["processed"] for h in handlers)
        wait_until(spread, what="every processor and handler to have done work")
    finally:
        for c in conns:
            c.close()


def test_an_unknown_api_key_gets_an_error_naming_it_and_the_connection_stays_usable(shared_broker):
    broker = shared_broker
    with connect(broker) as conn:
        with pytest.raises(OdradekError) as err:
            conn.request(4242, {})
        assert err.value.code == ErrorCode.INVALID_REQUEST and "4242" in err.value.message
        assert conn.request(ApiKey.PING, {"still": "here"}).body == {"still": "here"}


def test_an_unsupported_version_gets_unsupported_version(shared_broker):
    broker = shared_broker
    with connect(broker) as conn:
        with pytest.raises(OdradekError) as err:
            conn.request(ApiKey.METADATA, {}, version=9)
    assert err.value.code == ErrorCode.UNSUPPORTED_VERSION and "METADATA" in err.value.message


def test_a_malformed_body_gets_invalid_request_naming_the_field(shared_broker):
    broker = shared_broker
    with connect(broker) as conn:
        with pytest.raises(OdradekError) as err:
            conn.request(ApiKey.METADATA, {"topics": "not-a-list"})
        assert err.value.code == ErrorCode.INVALID_REQUEST and "'topics'" in err.value.message
        with pytest.raises(OdradekError) as err:
            conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, {"resources": "all"})
        assert err.value.code == ErrorCode.INVALID_REQUEST and "'resources'" in err.value.message
        body = {"resources": [{"type": "broker", "configs": [7]}]}
        [res] = conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, body).body["resources"]
        assert res["error_code"] == ErrorCode.INVALID_REQUEST and "'name'" in res["error_message"]


def test_describe_configs_reports_the_broker_settings(shared_broker):
    broker = shared_broker
    with connect(broker) as conn:
        body = conn.request(ApiKey.DESCRIBE_CONFIGS, {"resources": [{"type": "broker", "name": "0"}]}).body
    [res] = body["resources"]
    configs = {c["name"]: c for c in res["configs"]}
    assert res["error_code"] == 0
    assert configs["num.io.threads"]["dynamic"] is True and configs["num.io.threads"]["value"] == "2"
    assert configs["socket.request.max.bytes"]["dynamic"] is False


def test_altering_a_static_config_is_refused_naming_the_key(shared_broker):
    broker = shared_broker
    body = {"resources": [{"type": "broker", "name": "0",
                           "configs": [{"name": "socket.request.max.bytes", "value": "5", "op": "set"}]}]}
    with connect(broker) as conn:
        [res] = conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, body).body["resources"]
    assert res["error_code"] == ErrorCode.INVALID_CONFIG
    assert "socket.request.max.bytes" in res["error_message"] and "not a dynamic" in res["error_message"]


@pytest.mark.parametrize("value", ["zero", "0", "65"])
def test_a_bad_handler_count_is_refused(shared_broker, value):
    broker = shared_broker
    body = {"resources": [{"type": "broker", "name": "0",
                           "configs": [{"name": "num.io.threads", "value": value, "op": "set"}]}]}
    with connect(broker) as conn:
        [res] = conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, body).body["resources"]
    assert res["error_code"] == ErrorCode.INVALID_CONFIG and "num.io.threads" in res["error_message"]


def test_a_request_for_another_broker_id_is_refused(shared_broker):
    broker = shared_broker
    body = {"resources": [{"type": "broker", "name": "7", "configs": []}]}
    with connect(broker) as conn:
        [res] = conn.request(ApiKey.DESCRIBE_CONFIGS, body).body["resources"]
    assert res["error_code"] == ErrorCode.INVALID_REQUEST and "7" in res["error_message"]


def test_bootstrap_strings_parse_into_host_port_pairs():
    assert parse_bootstrap("127.0.0.1:9092, localhost:1") == [("127.0.0.1", 9092), ("localhost", 1)]
    assert parse_bootstrap(["PLAINTEXT://127.0.0.1:5"]) == [("127.0.0.1", 5)]
    with pytest.raises(OdradekError):
        parse_bootstrap("no-port")

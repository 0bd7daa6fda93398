"""Kafka client properties files as the tools read them (--command-config): Java's
.properties syntax, Kafka's and librdkafka's names, PEM only (odradek/client_properties.py)."""
from __future__ import annotations

import pytest

from odradek.client_properties import client_options
from odradek.core.protocol import OdradekError


def write(tmp_path, text: str) -> str:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return str(path)


def test_kafkas_names_with_a_jaas_line_continued_and_both_separators(tmp_path):
    path = write(tmp_path, "# a comment\n! another\nsecurity.protocol = SASL_SSL\nsasl.mechanism: SCRAM-SHA-512\n"
                           "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
                           '   username="al ice" password="p=w\\"d";\n'
                           "ssl.truststore.location=/etc/ca.pem\nssl.truststore.type=PEM\n"
                           "ssl.endpoint.identification.algorithm=\nclient.id=tool\n")
    security, props = client_options(path)
    assert security == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                        "sasl_plain_username": "al ice", "sasl_plain_password": 'p=w"d', "ssl_cafile": "/etc/ca.pem",
                        "ssl_check_hostname": False}
    assert props["client.id"] == "tool"


def test_librdkafkas_names_and_properties_that_win_over_the_file(tmp_path):
    path = write(tmp_path, "security.protocol=sasl_plaintext\nsasl.mechanisms=PLAIN\nsasl.username=bob\n"
                           "sasl.password=secret\nssl.certificate.location=/c.pem\nssl.key.location=/k.pem\n")
    security, props = client_options(path, properties=["sasl.username=carol", "group.id=g"])
    assert security["security_protocol"] == "SASL_PLAINTEXT" and security["sasl_mechanism"] == "PLAIN"
    assert security["sasl_plain_username"] == "carol" and security["sasl_plain_password"] == "secret"
    assert (security["ssl_certfile"], security["ssl_keyfile"]) == ("/c.pem", "/k.pem") and props["group.id"] == "g"


def test_a_jks_store_a_missing_file_and_a_bare_property_are_refused_in_one_line(tmp_path):
    with pytest.raises(OdradekError, match="JKS store; the tools read PEM"):
        client_options(write(tmp_path, "ssl.truststore.location=/etc/truststore.jks\n"))
    with pytest.raises(OdradekError, match="cannot read the client properties file"):
        client_options(str(tmp_path / "missing.properties"))
    with pytest.raises(OdradekError, match="expected key=value"):
        client_options(None, properties=["acks"])

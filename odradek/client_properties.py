"""Kafka's client properties files (``--command-config``, ``--producer.config``,
``--consumer.config``) for the command-line tools, read into the bundled client's security
options (kafka-python's names, ``network/clientauth.py``).

The file is Java's ``.properties`` format (``key=value`` or ``key: value``, ``#``/``!``
comments, a trailing backslash continues a line). Understood, with Kafka's and librdkafka's
names:

  security.protocol                        PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
  sasl.mechanism                           PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
  sasl.jaas.config                         ``... required username="u" password="p";``
                                           (PlainLoginModule or ScramLoginModule)
  sasl.username / sasl.password            librdkafka's spelling of the same
  ssl.truststore.location                  a PEM file of CA certificates (ssl.truststore.type=PEM;
                                           a JKS/PKCS12 store is refused, saying how to convert it)
  ssl.ca.location                          librdkafka's spelling
  ssl.keystore.location                    a PEM file with the client's certificate and key
                                           (ssl.keystore.type=PEM), for SSL client authentication
  ssl.certificate.location / ssl.key.location   librdkafka's spelling, two files
  ssl.endpoint.identification.algorithm   "" turns the host name check off (Kafka's default: https)

Other keys (``client.id``, ``request.timeout.ms``, ...) are returned in ``extra`` for the
tool that has a use for them and otherwise ignored, as Kafka's tools ignore them. No
password is needed on the command line; the file holds it (keep it 0600).
"""
from __future__ import annotations

import re
import shlex

from odradek.core.protocol import ErrorCode, OdradekError

_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*("(?:[^"\\]|\\.)*"|\S+?)(?=\s|;|$)')


def read_properties(path: str) -> dict[str, str]:
    """A Java ``.properties`` file as a dict (the common subset: no unicode escapes)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise OdradekError(f"cannot read the client properties file {path}: {exc.strerror}",
                           ErrorCode.INVALID_CONFIG) from None
    out, pending = {}, ""
    for raw in lines:
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        m = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if not m:
            out[line] = ""
            continue
        out[m.group(1)] = m.group(2).strip()
    if pending:
        out.setdefault(pending, "")
    return out


def _jaas(value: str) -> tuple[str | None, str | None]:
    """username and password of a ``sasl.jaas.config`` value."""
    found = {}
    for key, raw in _JAAS_OPTION.findall(value):
        if raw.startswith('"'):
            raw = shlex.split(raw)[0] if raw.endswith('"') else raw.strip('"')
        found[key] = raw
    return found.get("username"), found.get("password")


def security_options(props: dict[str, str], source: str = "the client properties") -> dict:
    """The bundled client's security options (kafka-python's names) of Kafka client ``props``."""
    out: dict = {}
    if props.get("security.protocol"):
        out["security_protocol"] = props["security.protocol"].upper()
    if props.get("sasl.mechanism") or props.get("sasl.mechanisms"):
        out["sasl_mechanism"] = (props.get("sasl.mechanism") or props["sasl.mechanisms"]).upper()
    user, password = _jaas(props["sasl.jaas.config"]) if props.get("sasl.jaas.config") else (None, None)
    user = props.get("sasl.username", user)
    password = props.get("sasl.password", password)
    if user is not None:
        out["sasl_plain_username"] = user
    if password is not None:
        out["sasl_plain_password"] = password
    for store, kind in (("ssl.truststore", "CA certificates"), ("ssl.keystore", "certificate and key")):
        location = props.get(f"{store}.location")
        if not location:
            continue
        store_type = props.get(f"{store}.type", "PEM" if location.endswith((".pem", ".crt")) else "JKS").upper()
        if store_type != "PEM":
            raise OdradekError(f"{source}: {store}.location {location} is a {store_type} store; the tools read PEM "
                               f"files: set {store}.type=PEM and convert it (keytool -exportcert -rfc, or openssl "
                               f"pkcs12 -nodes)", ErrorCode.INVALID_CONFIG)
        if store == "ssl.truststore":
            out["ssl_cafile"] = location
        else:
            out["ssl_certfile"] = out["ssl_keyfile"] = location
    for key, option in (("ssl.ca.location", "ssl_cafile"), ("ssl.certificate.location", "ssl_certfile"),
                        ("ssl.key.location", "ssl_keyfile")):
        if props.get(key):
            out[option] = props[key]
    if props.get("ssl.endpoint.identification.algorithm") is not None:
        out["ssl_check_hostname"] = props["ssl.endpoint.identification.algorithm"].strip().lower() == "https"
    return out


def client_options(*paths: str | None, properties: list[str] | None = None) -> tuple[dict, dict]:
    """``(security options, every property)`` of the files (later ones win) and ``key=value``
    ``properties`` (``--consumer-property``, ``--producer-property``: they win over files)."""
    props: dict[str, str] = {}
    for path in paths:
        if path:
            props.update(read_properties(path))
    for item in properties or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OdradekError(f"expected key=value, got {item!r}", ErrorCode.INVALID_CONFIG)
        props[key.strip()] = value.strip()
    return security_options(props, ", ".join(p for p in paths if p) or "--*-property"), props


def add_arguments(p, producer: bool = False, consumer: bool = False) -> None:
    """The tools' options for a client properties file (Kafka's spellings)."""
    p.add_argument("--command-config", metavar="FILE",
                   help="Kafka client properties: security.protocol, sasl.mechanism, sasl.jaas.config, "
                        "ssl.truststore.location (PEM), ... (docs/CLIENT.md)")
    if producer:
        p.add_argument("--producer.config", dest="producer_config", metavar="FILE",
                       help="producer properties file (as --command-config)")
        p.add_argument("--producer-property", action="append", default=[], metavar="KEY=VALUE",
                       help="one producer property (repeatable; wins over the files)")
    if consumer:
        p.add_argument("--consumer.config", dest="consumer_config", metavar="FILE",
                       help="consumer properties file (as --command-config)")
        p.add_argument("--consumer-property", action="append", default=[], metavar="KEY=VALUE",
                       help="one consumer property (repeatable; wins over the files)")


def options_of(args) -> dict:
    """The security options of a parsed command line's properties files and properties."""
    return args_properties(args)[0]


def args_properties(args) -> tuple[dict, dict]:
    paths = [getattr(args, "command_config", None), getattr(args, "producer_config", None),
             getattr(args, "consumer_config", None)]
    items = list(getattr(args, "producer_property", None) or []) + list(getattr(args, "consumer_property", None) or [])
    return client_options(*paths, properties=items)

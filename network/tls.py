"""TLS contexts for the SSL and SASL_SSL listeners and for clients, with the standard library's
``ssl``. No I/O beyond reading the PEM files named in the config.

Broker side (``server_context``): ``ssl.certfile`` + ``ssl.keyfile``, ``ssl.cafile`` for client
certificates, ``ssl.client.auth`` = required | requested | none; TLS 1.2 at least. The processor
wraps each socket of a TLS listener with it and runs the handshake non-blocking in its loop.
Client side (``client_context``): kafka-python's option names (network/clientauth.py).
``principal`` names a client by its certificate subject as Kafka's default principal builder
does: ``User:`` + the distinguished name in RFC 2253 order (``CN=alice,O=example``).
"""
from __future__ import annotations

import ssl

CLIENT_AUTH = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def server_context(config: dict) -> ssl.SSLContext:
    """The TLS context of this broker's TLS listeners; ValueError naming the setting at fault."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(config["ssl.certfile"], config["ssl.keyfile"] or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load ssl.certfile {config['ssl.certfile']!r} with ssl.keyfile "
                         f"{config['ssl.keyfile']!r}: {exc}") from None
    mode = CLIENT_AUTH[config.get("ssl.client.auth", "none")]
    if mode != ssl.CERT_NONE:
        try:
            if config.get("ssl.cafile"):
                ctx.load_verify_locations(cafile=config["ssl.cafile"])
            else:
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load ssl.cafile {config['ssl.cafile']!r}: {exc}") from None
    ctx.verify_mode = mode
    return ctx


def client_context(cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """A client's context: the broker's certificate must chain to ``cafile`` (or the
    system's CAs); ``certfile``/``keyfile`` present this client's certificate (mutual TLS)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile or None)
    ctx.check_hostname = bool(check_hostname)
    if certfile:
        ctx.load_cert_chain(certfile, keyfile or None)
    return ctx


def principal(cert: dict | None) -> str | None:
    """``User:CN=alice,O=example`` from ``SSLSocket.getpeercert()``; None without a certificate."""
    if not cert or not cert.get("subject"):
        return None
    parts = []
    for rdn in reversed(cert["subject"]):
        parts.append("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn))
    return "User:" + ",".join(parts)


_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
          "stateOrProvinceName": "ST", "localityName": "L", "domainComponent": "DC", "userId": "UID",
          "emailAddress": "EMAILADDRESS"}


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    return out

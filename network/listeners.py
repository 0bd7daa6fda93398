"""Listeners as Kafka names them: ``listeners``, ``advertised.listeners``,
``listener.security.protocol.map`` and ``inter.broker.listener.name``. Pure, no I/O; the
config, the acceptor, the processors and the handlers share it, and the console and the HTTP
proxy find how to reach their own broker here (``own_client``).

``listeners = "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093"``: each entry is
``NAME://host:port``. NAME is a security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) or a
name ``listener.security.protocol.map`` (``NAME:PROTOCOL,...``) maps to one, as in Kafka.
Invariants: names are unique; a port appears once (0 excepted: any free port).
"""
from __future__ import annotations

from typing import NamedTuple
from urllib.parse import urlsplit

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class Listener(NamedTuple):
    name: str  # e.g. "PLAINTEXT", "CLIENT"
    protocol: str  # one of PROTOCOLS
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def url(self, port: int | None = None) -> str:
        return f"{self.name}://{self.host}:{self.port if port is None else port}"


def parse_map(value: str) -> dict[str, str]:
    """``"CLIENT:SASL_SSL,REPL:SSL"`` -> {"CLIENT": "SASL_SSL", ...}; the protocols map to themselves."""
    out = {p: p for p in PROTOCOLS}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        name, sep, proto = item.strip().partition(":")
        proto = proto.strip().upper()
        if not sep or not name.strip() or proto not in PROTOCOLS:
            raise ValueError(f"{item.strip()!r} in listener.security.protocol.map is not NAME:PROTOCOL "
                             f"with PROTOCOL one of {', '.join(PROTOCOLS)}")
        out[name.strip().upper()] = proto
    return out


def parse(value: str, protocol_map: str | None = "") -> list[Listener]:
    """Every listener of a ``listeners`` (or ``advertised.listeners``) value, in order;
    ``protocol_map`` None checks the form only (a name not yet mapped is PLAINTEXT)."""
    protocols = parse_map(protocol_map or "")
    out: list[Listener] = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        if "://" not in item:
            item = "PLAINTEXT://" + item
        scheme, _, rest = item.partition("://")
        parts = urlsplit("tcp://" + rest)  # a URL scheme may not hold '_' (SASL_SSL): split it off first
        name = scheme.strip().upper()
        if name not in protocols and protocol_map is not None:
            raise ValueError(f"listener {item!r}: {name!r} is neither a security protocol ({', '.join(PROTOCOLS)}) "
                             f"nor a name in listener.security.protocol.map")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"listener {item!r} has no valid port") from None
        if not parts.hostname or port is None:
            raise ValueError(f"listener {item!r} is not of the form {name}://host:port")
        if any(l.name == name for l in out):
            raise ValueError(f"listener name {name} appears twice in {value!r}")
        if port and any(l.port == port for l in out):
            raise ValueError(f"port {port} appears twice in {value!r}")
        out.append(Listener(name, protocols.get(name, "PLAINTEXT"), parts.hostname, port))
    if not out:
        raise ValueError(f"{value!r} names no listener")
    return out


def of_config(config: dict) -> list[Listener]:
    return parse(config.get("listeners") or "PLAINTEXT://127.0.0.1:9092",
                 config.get("listener.security.protocol.map", ""))


def inter_broker(config: dict) -> Listener:
    """The listener the other brokers (replica fetcher, controller channel) use: the one
    ``inter.broker.listener.name`` names, else the first."""
    listeners = of_config(config)
    wanted = (config.get("inter.broker.listener.name") or "").upper()
    for l in listeners:
        if l.name == wanted:
            return l
    return listeners[0]


def advertised(config: dict) -> dict[str, tuple[str, int]]:
    """Listener name -> the (host, port) given to clients: ``advertised.listeners`` where it
    names the listener, else the listener's own address (port 0 until the bound port is known)."""
    out = {l.name: (l.host, l.port) for l in of_config(config)}
    if config.get("advertised.listeners"):
        adv = parse(config["advertised.listeners"], config.get("listener.security.protocol.map", ""))
        if len(adv) == 1 and adv[0].name not in out:  # a bare host:port means the first listener
            adv = [adv[0]._replace(name=next(iter(out)))]
        for l in adv:
            if l.name in out:
                out[l.name] = (l.host, l.port or out[l.name][1])
    return out


def own_client(config: dict, bound: dict, user: str | None = None,
               password: str | None = None) -> tuple[str, dict] | None:
    """Where and how a client inside the broker (the console, the HTTP proxy) reaches its own
    broker: ``(host:port, client options)``, or None if no listener serves it. ``bound`` maps
    listener names to their bound ``host:port`` (the supervisor's status). Without a user: a
    PLAINTEXT listener, else an SSL one with ``broker_tls``. As ``user``: a SASL_PLAINTEXT
    listener, else a SASL_SSL one, with the strongest enabled mechanism."""
    def first(protocol: str) -> str | None:
        return next((bound[l.name] for l in of_config(config) if l.protocol == protocol and l.name in bound), None)

    if user is None:
        if (address := first("PLAINTEXT")) is not None:
            return address, {}
        if (address := first("SSL")) is not None:
            return address, {"security_protocol": "SSL", **broker_tls(config)}
        return None
    if (address := first("SASL_PLAINTEXT")) is not None:
        security: dict = {"security_protocol": "SASL_PLAINTEXT"}
    elif (address := first("SASL_SSL")) is not None:
        security = {"security_protocol": "SASL_SSL", **broker_tls(config)}
    else:
        return None
    enabled = [m.strip().upper() for m in str(config.get("sasl.enabled.mechanisms") or "").split(",")]
    mechanism = next((m for m in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN") if m in enabled), "SCRAM-SHA-512")
    return address, {**security, "sasl_mechanism": mechanism, "sasl_plain_username": user,
                     "sasl_plain_password": password}


def broker_tls(config: dict) -> dict:
    """Client TLS options from the broker's own settings: its certificate must chain to
    ``ssl.cafile`` (the system's CAs when empty) and name the listener's address; where the
    listeners ask for client certificates (``ssl.client.auth`` required or requested) the
    client presents the broker's own certificate and key, so on an SSL listener it is
    ``User:<the broker certificate's subject>`` to the ACLs (on SASL_SSL the SASL user)."""
    options = {"ssl_cafile": config.get("ssl.cafile") or None}
    if config.get("ssl.client.auth", "none") != "none" and config.get("ssl.certfile"):
        options.update(ssl_certfile=config["ssl.certfile"], ssl_keyfile=config.get("ssl.keyfile") or None)
    return options

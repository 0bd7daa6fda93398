"""The admin listener's Host check: the defence of every HTTP request against DNS rebinding
(docs/DECISIONS.md says why a Host check).

Runs on the metrics actor's HTTP server threads, as a WSGI middleware around the whole
application (``/metrics``, ``/health/*``, the console, its static files and 404s alike).
Owns nothing but the set of host names it accepts, fixed at start.
Invariant: a request whose ``Host`` is not a name this console is known by is refused with
421 Misdirected Request before any route runs. Accepted: IP address literals, ``localhost``
and its subdomains (RFC 6761: loopback only), the ``admin.listener`` host, the hosts of
``listeners`` and ``advertised.listeners``, and, when the admin listener is bound to every
address (``0.0.0.0``/``::``), this machine's host name and fully qualified name. A request
without a ``Host`` (HTTP/1.0 tools) is not a browser's and is served.
"""
from __future__ import annotations

import ipaddress
import logging
import socket

from odradek.network import listeners as listeners_mod

log = logging.getLogger("odradek.console")

WILDCARDS = ("", "0.0.0.0", "::")


def split_host(value: str) -> str:
    """The host name of a ``Host`` header (``name:port``, ``[v6]:port``), lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    host, sep, port = value.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else value


def known_names(config: dict, admin_host: str) -> frozenset[str]:
    """The DNS names this console is known by (IP literals and localhost are accepted apart)."""
    names = {admin_host.lower().strip("[]")}
    for value in (config.get("listeners"), config.get("advertised.listeners")):
        if value:
            try:
                names.update(l.host.lower() for l in listeners_mod.parse(value, None))
            except ValueError:  # the broker refuses such a config at start: nothing to add here
                pass
    if admin_host in WILDCARDS:
        names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
    return frozenset(n for n in names if n and n not in WILDCARDS)


class HostCheck:
    """WSGI middleware: serves ``app`` only to requests whose Host this console answers to."""

    def __init__(self, app, names: frozenset[str]):
        self.app = app
        self.names = names

    def allowed(self, host: str) -> bool:
        if host in self.names or host == "localhost" or host.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            return False

    def __call__(self, environ, start_response):
        header = environ.get("HTTP_HOST")
        if header is None or self.allowed(split_host(header)):
            return self.app(environ, start_response)
        shown = header[:200]
        log.warning("console: refused a request for host %r from %s (not a name of this console: DNS rebinding?)",
                    shown, environ.get("REMOTE_ADDR", "?"))
        body = (f"421 Misdirected Request: this console does not answer to the host name {shown!r}. "
                f"Open it by an IP address, localhost, or the host of admin.listener or listeners "
                f"(a page that reached it by another name may be a DNS-rebinding attack).\n").encode()
        start_response("421 Misdirected Request", [("Content-Type", "text/plain; charset=utf-8"),
                                                   ("Content-Length", str(len(body)))])
        return [body]

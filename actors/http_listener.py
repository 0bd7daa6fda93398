"""An actor's HTTP listener: a waitress server on threads of its own, started and stopped by the
actor that owns it (the schema registry's and the HTTP proxy's; docs/ARCHITECTURE.md).

Threads: waitress's event loop (one thread, named ``thread_name``) reads each request whole
before one of its ``threads`` workers runs the WSGI application, so a slow client holds a
connection slot (at most ``connection_limit``, closed after ``channel_timeout`` idle), never a
worker. Invariant: the application never touches the actor's sockets; it hands work to the
actor's loop with ``Actor.post``.
"""
from __future__ import annotations

import json
import threading
from typing import Any, Callable

import waitress


def http_settings(ident: str, max_body: int, threads: int = 4) -> dict:
    """waitress's settings for an actor's listener (``ident``: its Server header)."""
    return dict(threads=threads, connection_limit=100, channel_timeout=30, max_request_header_size=64 * 1024,
                max_request_body_size=max_body, asyncore_use_poll=True, ident=ident, expose_tracebacks=False)


def serve(app: Callable, address: tuple[str, int], settings: dict, thread_name: str) -> tuple[Any, str, int]:
    """Bind ``address`` and serve ``app`` on a daemon thread; ``(server, host, bound port)``.
    Raises OSError when the address cannot be bound (the caller says why and runs without it)."""
    server = waitress.create_server(app, host=address[0], port=address[1], **settings)
    port = getattr(server, "effective_port", None)  # one address; several (localhost: ::1 and 127.0.0.1) else
    port = int(port if port is not None else server.effective_listen[0][1])  # waitress: a str
    threading.Thread(target=server.run, name=thread_name, daemon=True).start()
    return server, address[0], port


def stop(server) -> None:
    """Stop the worker threads (a request may be waiting) and close the listener."""
    if server is not None:
        server.task_dispatcher.shutdown(timeout=2)
        server.close()


def read_json(environ: dict, max_body: int, refuse: Callable[[int, str], Exception]) -> Any:
    """A WSGI request's JSON body, None when empty. ``refuse(status, why)`` is raised with 400
    for a Content-Length that is not a number or a body that is not JSON, 413 past ``max_body``."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise refuse(400, "Content-Length is not a number") from None
    if length > max_body:
        raise refuse(413, f"the request body is {length} bytes; at most {max_body} are read")
    raw = environ["wsgi.input"].read(length) if length > 0 else b""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise refuse(400, f"the request body is not JSON: {exc}") from None

"""The controller's channel to a broker whose connection went silent: a request a network
partition swallowed (the bytes never reach the broker, the connection stays open) is sent
again on a new connection after ``controller.socket.timeout.ms``, not after the request's
whole deadline. The chaos tool found the cost: an UPDATE_METADATA swallowed by a partition
left a broker's metadata stale for 30 s after the partition healed, and producers asking
that broker kept sending to a former leader."""
from __future__ import annotations

import socket
import threading
import time

from odradek.coordinator.channel import ControllerChannel
from odradek.core import codec
from odradek.core.protocol import ApiKey


class SilentFirstConnection:
    """Accepts connections; the first one's requests are read and never answered (swallowed),
    every later connection's are answered with success."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.answered = 0
        self.open: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop:
            try:
                c, _ = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            self.open.append(c)
            threading.Thread(target=self._serve, args=(c, self.connections == 1), daemon=True).start()

    def _serve(self, c: socket.socket, silent: bool) -> None:
        dec = codec.Decoder()
        while not self._stop:
            try:
                data = c.recv(65536)
            except OSError:
                return
            if not data:
                return
            if silent:
                continue  # swallowed: the connection stays open, nothing comes back
            dec.feed(data)
            while (frame := dec.next()) is not None:
                self.answered += 1
                c.sendall(b"".join(bytes(b) for b in codec.encode_response(frame.header["corr"], {"error_code": 0}, [])))

    def close(self) -> None:
        self._stop = True
        for c in self.open:
            c.close()
        self.listener.close()


def test_a_request_on_a_connection_gone_silent_is_sent_again_on_a_new_one_before_its_deadline():
    server = SilentFirstConnection()
    channel = ControllerChannel(lambda fn: fn(), "controller-9", attempt_timeout=0.5)
    answers: list = []
    try:
        channel.set_brokers({1: ("127.0.0.1", server.port)})
        channel.send(1, ApiKey.UPDATE_METADATA, {"controller_id": 9, "controller_epoch": 1},
                     lambda body, why: answers.append((body, why)), timeout=30.0)
        deadline = time.monotonic() + 15
        while not answers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answers, "no answer within 15 s: the request waited on the silent connection"
        body, why = answers[0]
        assert why is None and body["error_code"] == 0, answers
        assert server.connections == 2 and server.answered == 1
    finally:
        channel.close()
        server.close()

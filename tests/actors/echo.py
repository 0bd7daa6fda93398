"""Small actors used by the runtime's tests (they run in real spawned processes), and their
messages, declared as the broker's are (a test's own messages live in its own module)."""
import os
import time
from typing import Any, NamedTuple

from odradek.actors.messages import message
from odradek.actors.runtime import Actor


class Echoed(NamedTuple):
    value: Any
    by: str


@message("echo", reply=Echoed)
class EchoThis(NamedTuple):
    """Answered with ``value`` and the payload frames as they came."""

    value: Any = None


@message("hold")
class Hold(NamedTuple):
    """Kept unanswered: the runtime must fail it when the actor stops."""


@message("crash")
class Crash(NamedTuple):
    pass


@message("boom")
class Boom(NamedTuple):
    """Its handler raises: the runtime answers UNKNOWN_SERVER_ERROR."""


@message("relay", reply=Echoed)
class RelayThis(NamedTuple):
    value: Any = None


class Echo(Actor):
    """Answers ``echo`` with its fields and frames; ``hold`` is kept unanswered."""

    def on_echo(self, msg):
        self.reply(msg, Echoed(msg.fields.value, self.name), [bytes(f) for f in msg.frames])

    def on_hold(self, msg):
        self.hold(msg)  # never answered: the runtime must fail it when we stop

    def on_crash(self, msg):
        os._exit(3)

    def on_boom(self, msg):
        raise ValueError("boom")


class Relay(Actor):
    """Watches the ``echo`` role and relays ``relay`` requests to its members round robin:
    a stand-in for a processor routing to a handler pool."""

    def on_start(self):
        self.i = 0

    def on_relay(self, msg):
        members = self.members.get("echo") or []
        if not members:
            self.reply_error(msg, 8, "no echo member")
            return
        self.i += 1
        self.forward(msg, members[self.i % len(members)], EchoThis(msg.fields.value))


class Crasher(Actor):
    """Dies right after start: exercises the restart-intensity limit."""

    def on_start(self):
        self.call_later(0.05, lambda: os._exit(7))


class SlowStop(Echo):
    """Takes ``stop_seconds`` to stop, as a log actor closing many partitions does."""

    def on_stop(self):
        time.sleep(float(self.args.get("stop_seconds", 2.0)))

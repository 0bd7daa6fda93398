"""Small actors used by the runtime's tests (they run in real spawned processes)."""
import os
import time

from odradek.actors.runtime import Actor


class Echo(Actor):
    """Answers ``echo`` with its fields and frames; ``hold`` is kept unanswered."""

    def on_echo(self, msg):
        self.reply(msg, {"fields": msg.fields, "by": self.name}, [bytes(f) for f in msg.frames])

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
        self.forward(msg, members[self.i % len(members)], "echo")


class Crasher(Actor):
    """Dies right after start: exercises the restart-intensity limit."""

    def on_start(self):
        self.call_later(0.05, lambda: os._exit(7))


class SlowStop(Echo):
    """Takes ``stop_seconds`` to stop, as a log actor closing many partitions does."""

    def on_stop(self):
        time.sleep(float(self.args.get("stop_seconds", 2.0)))

"""A tiny actor used by the runtime's tests: answers ``echo`` with its fields and frames."""
from actors.runtime import Actor


class Echo(Actor):
    def on_echo(self, msg):
        self.reply(msg, {"fields": msg.fields, "by": self.name}, [bytes(f) for f in msg.frames])

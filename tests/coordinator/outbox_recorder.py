"""A recording ``controller_kit.Outbox`` for the coordinators' parts: what they sent, answered
and scheduled, with timers the test fires itself. No actor, no sockets."""
from __future__ import annotations

from odradek.coordinator.controller_kit import Outbox


class Timer:
    def __init__(self, delay, callback):
        self.delay, self.callback, self.cancelled = delay, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class Recorder:
    """What the parts sent through their outbox: ``requests`` (to, type, body, callback),
    ``replies`` (msg, fields), ``errors`` (msg, code, why), ``timers``."""

    def __init__(self):
        self.requests, self.replies, self.errors, self.timers = [], [], [], []
        self.outbox = Outbox(send=None, request=self.request,
                             reply=lambda msg, fields: self.replies.append((msg, fields)),
                             reply_error=lambda msg, code, why: self.errors.append((msg, code, why)),
                             post=lambda fn: fn(), members=lambda role: [], later=self.later,
                             cancel_request=lambda corr: None)

    def request(self, to, body, frames=(), callback=None, timeout=None):
        self.requests.append((to, body.TYPE, body, callback))

    def later(self, delay, callback):
        timer = Timer(delay, callback)
        self.timers.append(timer)
        return timer

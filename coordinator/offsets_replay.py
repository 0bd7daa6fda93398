"""The replay of a ``__consumer_offsets`` partition into an ``OffsetsView``: its groups and
committed offsets, read from the partition's files.

Runs in the ``group_coordinator`` process; no messages of its own (the coordinator asks the
hosting log actor for the partition's bounds, ``get_bounds``, and hands them to ``begin``).
Reads the files read-only (``coordinator.internal_replay``, which skips and logs what cannot
be read) up to the log end the leader's log actor reported: on a new leader everything it has
becomes committed. ``replay_some`` works in slices of a byte budget so that a large partition
loads between other messages.
"""
from __future__ import annotations

import time

from odradek.actors.messages import Bounds, LogBounds, PartitionBounds
from odradek.coordinator.internal_replay import InternalReplay
from odradek.coordinator.offsets import OffsetsView
from odradek.core.protocol import OFFSETS_TOPIC


def bounds_of(answer: Bounds | None, partition: int, topic: str = OFFSETS_TOPIC) -> LogBounds | None:
    """The bounds of ``topic``'s ``partition`` (an internal topic's) in a ``get_bounds``
    answer (None: no answer); None if the log actor does not host it, or hosts it but (still)
    as a follower."""
    for part in () if answer is None else answer.parts:
        part = PartitionBounds(*part)
        if part.topic == topic and part.partition == partition:
            return part.bounds if part.leader else None  # a follower: not the leader yet
    return None


class OffsetsReplay:
    """A ``__consumer_offsets`` partition being replayed (one load: ``token`` tells it from a
    later load of the same partition)."""

    __slots__ = ("partition", "token", "epoch", "view", "files", "records", "attempts", "started")

    def __init__(self, partition: int, token: int, epoch: int):
        self.partition, self.token, self.epoch = partition, token, epoch
        self.view, self.files = OffsetsView(), None
        self.records = self.attempts = 0
        self.started = time.monotonic()

    def begin(self, bounds: LogBounds, data_dir: str) -> None:
        self.files = InternalReplay(data_dir, OFFSETS_TOPIC, self.partition, bounds)

    def replay_some(self, budget: int | None) -> bool:
        """Replay up to ``budget`` bytes (None: all); True once the partition is replayed."""
        for r in self.files.records(budget):
            why = self.view.apply(r.key, r.value, r.offset)
            if why:
                self.files.skip(r.offset, why)
            self.records += 1
        return self.files.done

    def skip(self, offset: int, why: str) -> None:
        """A record read but not usable when installed (a group the coordinator cannot rebuild)."""
        self.files.skip(offset, why)

    def restart(self) -> None:
        """After a failed slice: drop what was read; ``begin`` again with fresh bounds."""
        self.close()
        self.view, self.records = OffsetsView(), 0

    def close(self) -> None:
        if self.files is not None:
            self.files.close()

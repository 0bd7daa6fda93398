"""The replay of a ``__consumer_offsets`` partition into an ``OffsetsView``: its groups and
committed offsets, read from the partition's files.

Runs in the ``group_coordinator`` process; no messages of its own (the coordinator asks the
hosting log actor for the partition's bounds, ``get_bounds``, and hands them to ``begin``).
Reads the files read-only (``log.reader.LogReader``) up to the log end the leader's log actor
reported: on a new leader everything it has becomes committed. ``replay_some`` works in
slices of a byte budget so that a large partition loads between other messages.
"""
from __future__ import annotations

import time

from odradek.actors.names import LogBounds, PartitionBounds, partition_dir
from odradek.coordinator.offsets import OFFSETS_TOPIC, OffsetsView
from odradek.log.reader import LogReader
from odradek.log.records import decode_batch, iter_batches
from odradek.network.protocol import OdradekError

READ_BYTES = 1 << 20


def bounds_of(fields: dict, partition: int) -> LogBounds | None:
    """The partition's bounds in a ``get_bounds`` answer; None if the log actor does not host
    it, or hosts it but (still) as a follower."""
    for part in fields.get("parts") or ():
        part = PartitionBounds(*part)
        if part.topic == OFFSETS_TOPIC and part.partition == partition:
            return part.bounds if part.leader else None  # a follower: not the leader yet
    return None


class OffsetsReplay:
    """A ``__consumer_offsets`` partition being replayed (one load: ``token`` tells it from a
    later load of the same partition)."""

    __slots__ = ("partition", "token", "epoch", "view", "reader", "bounds", "offset", "end", "records",
                 "attempts", "started")

    def __init__(self, partition: int, token: int, epoch: int):
        self.partition, self.token, self.epoch = partition, token, epoch
        self.view, self.reader, self.bounds = OffsetsView(), None, None
        self.offset = self.end = self.records = self.attempts = 0
        self.started = time.monotonic()

    def begin(self, bounds: LogBounds, data_dir: str) -> None:
        self.bounds, self.offset, self.end = bounds, bounds.log_start_offset, bounds.log_end_offset
        if self.offset < self.end:
            self.reader = LogReader(partition_dir(data_dir, OFFSETS_TOPIC, self.partition), bounds)

    def replay_some(self, budget: int | None) -> bool:
        """Replay up to ``budget`` bytes (None: all); True once the partition is replayed."""
        read, retries = 0, 0
        while self.offset < self.end and (budget is None or read < budget):
            result = self.reader.read(self.offset, READ_BYTES, upper_bound=self.end)
            if not result.slices:
                return True
            try:
                data = result.read_bytes()
            except OdradekError:  # compacted under us: list the files again and retry
                retries += 1
                if retries > 10:
                    raise
                self.reader.update(self.bounds._replace(generation=-1))
                continue
            read += len(data)
            for pos, h in iter_batches(data):
                for r in decode_batch(memoryview(data)[pos:pos + h.size]):
                    if r.offset >= self.offset:
                        self.view.apply(r.key, r.value)
                        self.records += 1
                self.offset = max(self.offset, h.next_offset)
        return self.offset >= self.end

    def restart(self) -> None:
        """After a failed slice: drop what was read; ``begin`` again with fresh bounds."""
        self.close()
        self.view, self.records = OffsetsView(), 0

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None

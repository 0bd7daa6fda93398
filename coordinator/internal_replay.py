"""Reading an internal topic's partition back from its files, for the coordinator that owns it
(the group coordinator replays ``__consumer_offsets``, the transaction coordinator
``__transaction_state``).

Runs in the coordinator's process; no messages of its own. Reads the files read-only
(``log.reader.LogReader``) up to the bounds the partition's log actor reported, in slices of
a byte budget so a large partition loads between other messages.

What cannot be read is skipped and logged (topic, partition, offset, why), never raised: one
unreadable record must not stop a coordinator, nor the broker from starting. Skipped: a record
the coordinator cannot parse (it calls ``skip``); a batch whose records do not decode (CRC,
compression, record framing), by its offsets; after a batch header that is impossible, the
rest of its segment (no framing past it can be trusted). Control batches (transaction markers)
hold no coordinator state and are passed over quietly.
"""
from __future__ import annotations

import logging
import os
from typing import Iterator

from odradek.actors.names import partition_dir
from odradek.actors.messages import LogBounds
from odradek.core.errors import CorruptRecordError, StorageError
from odradek.log.reader import LogReader, list_log_bases
from odradek.core.records import Record, decode_batch, iter_batches

log = logging.getLogger("odradek.coordinator")

READ_BYTES = 1 << 20
MAX_LOGGED = 20  # skipped records logged one by one per replay; the others are counted in its summary
MAX_RETRIES = 10  # reads retried when a compaction swapped a segment under the reader


class InternalReplay:
    """One replay of ``topic``-``partition`` from ``bounds`` (not thread-safe: one caller)."""

    def __init__(self, data_dir: str, topic: str, partition: int, bounds: LogBounds):
        self.topic, self.partition = topic, partition
        self.directory = partition_dir(data_dir, topic, partition)
        self.offset, self.end = bounds.log_start_offset, bounds.log_end_offset
        self.bounds = bounds
        self.reader = LogReader(self.directory, bounds) if self.offset < self.end else None
        self.skipped = 0

    @property
    def done(self) -> bool:
        return self.offset >= self.end

    def records(self, budget: int | None = None) -> Iterator[Record]:
        """The readable records from where the last call stopped, until ``budget`` bytes were
        read (None: to the end)."""
        read, retries = 0, 0
        while not self.done and (budget is None or read < budget):
            try:
                result = self.reader.read(self.offset, READ_BYTES, upper_bound=self.end)
                data = result.read_bytes() if result.slices else b""
            except CorruptRecordError as exc:  # a header on the way to the offset is impossible
                self._skip_segment(str(exc))
                continue
            except StorageError:  # compacted under us: list the files again and retry
                retries += 1
                if retries > MAX_RETRIES:
                    raise
                self.reader.update(self.bounds._replace(generation=-1))
                continue
            if not data:  # nothing readable before the end (a gap compaction left)
                self.offset = self.end
                break
            read += len(data)
            before = self.offset
            yield from self._batches(data)
            if self.offset == before:  # no whole batch in what was read: its framing lies
                self._skip_segment(f"the batch at offset {before} is not whole where its header says")

    def _batches(self, data: bytes) -> Iterator[Record]:
        try:
            for pos, h in iter_batches(data):
                if not h.is_control:
                    try:
                        batch = decode_batch(memoryview(data)[pos:pos + h.size])
                    except CorruptRecordError as exc:
                        self.skip(h.base_offset, f"the batch of offsets {h.base_offset} to {h.last_offset} "
                                                 f"does not decode: {exc.message}")
                        batch = ()
                    for r in batch:
                        if r.offset >= self.offset:
                            yield r
                self.offset = max(self.offset, h.next_offset)
        except CorruptRecordError as exc:  # an impossible header: nothing after it can be framed
            self._skip_segment(exc.message)

    def skip(self, offset: int, why: str) -> None:
        """A record (or batch) that cannot be read: logged (the first ``MAX_LOGGED``), counted."""
        self.skipped += 1
        if self.skipped <= MAX_LOGGED:
            log.warning("%s-%d: offset %d cannot be read, skipped: %s", self.topic, self.partition, offset, why)

    def _skip_segment(self, why: str) -> None:
        """Skip from the current offset to the next segment (or the end)."""
        later = [b for b in list_log_bases(os.listdir(self.directory)) if b > self.offset]
        to = min(min(later, default=self.end), self.end)
        self.skip(self.offset, f"{why}; offsets {self.offset} to {to - 1} (the rest of the segment) skipped")
        self.offset = to

    def close(self) -> None:
        if self.skipped > MAX_LOGGED:
            log.warning("%s-%d: %d unreadable records or batches skipped in all (the first %d logged)",
                        self.topic, self.partition, self.skipped, MAX_LOGGED)
        if self.reader is not None:
            self.reader.close()
            self.reader = None

"""The aborted-transactions index of one partition: ``aborted.txnindex`` next to its segments.

Written by the partition's ``Log`` (so by its log actor, the single writer); read by the fetch
actor, which gives a ``read_committed`` fetch the aborted ranges it overlaps, so no fetch scans
the log for abort markers. Entries are Kafka's ``.txnindex`` layout (docs/FORMAT.md): 34 bytes,
big-endian: version int16 (0), producer id int64, first offset int64, last offset int64 (the
abort marker's), last stable offset int64. One file per partition, not one per segment as in
Kafka (entries below the log start are dropped when the file is rewritten on truncation or
retention).
Invariants: an entry is appended when its abort marker is; the file is not fsynced on its own:
recovery replays the log after the producer snapshot and re-adds a missing entry (``add``
ignores an entry it has).
"""
from __future__ import annotations

import bisect
import os
import struct
from typing import NamedTuple

from odradek.log.files import FileLayer

NAME = "aborted.txnindex"
ENTRY = struct.Struct(">hqqqq")
VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TxnIndex:
    def __init__(self, directory: str, files: FileLayer | None = None):
        self.path = os.path.join(directory, NAME)
        self._files = files or FileLayer()
        self.entries: list[AbortedTxn] = []  # ascending last offset
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        usable = len(data) - len(data) % ENTRY.size  # a torn last entry is dropped
        for pos in range(0, usable, ENTRY.size):
            version, *fields = ENTRY.unpack_from(data, pos)
            if version != VERSION:
                break
            self.entries.append(AbortedTxn(*fields))
        self.entries.sort(key=lambda e: e.last_offset)

    def add(self, entry: AbortedTxn) -> None:
        if any(e.producer_id == entry.producer_id and e.last_offset == entry.last_offset for e in self.entries[-64:]):
            return
        self.entries.append(entry)
        self.entries.sort(key=lambda e: e.last_offset)
        with open(self.path, "ab") as f:
            f.write(ENTRY.pack(VERSION, *entry))

    def aborted(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping ``[start, end)``: last offset >= start, first < end."""
        lasts = [e.last_offset for e in self.entries]
        i = bisect.bisect_left(lasts, start)
        return [e for e in self.entries[i:] if e.first_offset < end]

    def keep(self, low: int, high: int) -> None:
        """Keep only entries whose marker lies in ``[low, high)`` (retention, truncation)."""
        kept = [e for e in self.entries if low <= e.last_offset < high]
        if len(kept) == len(self.entries):
            return
        self.entries = kept
        self._files.write_file_atomically(self.path, b"".join(ENTRY.pack(VERSION, *e) for e in kept))

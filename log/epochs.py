"""The leader-epoch cache of one partition: where each leader epoch began in the log.

Kafka's leader-epoch file cache (KIP-101, KIP-279): ``(epoch, start_offset)`` entries. The
leader records an entry when it first appends in a new epoch; a follower records the epochs
stamped in the batches it copies and, on (re)start, truncates where the leader says its latest
epoch ended (``end_offset_for``, OFFSET_FOR_LEADER_EPOCH).
Owned by the partition's ``Log`` (``Log.leader_epochs``): single writer, not thread-safe.
Persisted in ``<partition dir>/leader-epoch-checkpoint`` (docs/FORMAT.md), rewritten
atomically on every change.
Invariants: epochs strictly increase, start offsets never decrease; every mutator changes
memory first, then the file: a failed write raises ``StorageError`` and leaves the cache dirty
(the next ``flush()`` writes it again); a stale file is safe (the log trims the cache to its
[log start, log end] on open); an unreadable file is never fatal (empty cache, a warning).
"""
from __future__ import annotations

import bisect
import logging
import os
from typing import NamedTuple

from odradek.core.errors import StorageError
from odradek.log.files import FileLayer
from odradek.core.protocol import ErrorCode

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
EPOCH_CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

log = logging.getLogger("odradek.log")


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """``(epoch, start_offset)`` entries for one partition, kept in a checkpoint file."""

    def __init__(self, directory: str, files: FileLayer | None = None):
        self.path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
        self._files = files or FileLayer()
        self._epochs: list[int] = []  # parallel lists: bisect on epochs, no key functions
        self._starts: list[int] = []
        # the latest epoch as a plain attribute: the log's append fast path compares it
        self._latest = UNDEFINED_EPOCH
        self.dirty = False
        self._load()

    # ------------------------------------------------------------------ queries
    @property
    def latest_epoch(self) -> int:
        """The newest epoch in the cache, -1 when it is empty."""
        return self._latest

    @property
    def entries(self) -> list[EpochEntry]:
        """A copy of the entries, oldest first."""
        return [EpochEntry(e, s) for e, s in zip(self._epochs, self._starts)]

    def __len__(self) -> int:
        return len(self._epochs)

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end_offset)``: the largest epoch <= ``requested_epoch`` and where it ended.

        It ended where the next larger epoch started, or at ``log_end_offset`` if it is the
        latest epoch (so a requested epoch above the latest gives ``(latest, log_end_offset)``).
        ``(-1, -1)`` when the cache is empty or ``requested_epoch`` is below its first epoch.
        """
        i = bisect.bisect_right(self._epochs, requested_epoch) - 1
        if i < 0:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if i == len(self._epochs) - 1:
            return self._epochs[i], log_end_offset
        return self._epochs[i], self._starts[i + 1]

    # ------------------------------------------------------------------ changes
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``. Returns True if the cache changed.

        An epoch <= the latest one is ignored (it is known already, or stale). Entries that
        start at or after ``start_offset`` are a stale tail (epochs whose data was truncated
        away, or that never got any) and are replaced by the new entry, as Kafka does.
        """
        if epoch <= self._latest:
            return False
        if start_offset < 0:
            raise ValueError(f"leader epoch {epoch} cannot start at negative offset {start_offset}")
        cut = bisect.bisect_left(self._starts, start_offset)
        if cut < len(self._starts):
            replaced = self.entries[cut:]
            # One epoch that started where this one does never got a record (a leader epoch
            # bumped again before any append: every step of a reassignment): expected, as in
            # Kafka's cache; anything else dropped a tail that held data, worth a warning.
            quiet = len(replaced) == 1 and replaced[0].start_offset == start_offset
            (log.debug if quiet else log.warning)("%s: epoch %d at offset %d replaces entries %s", self.path,
                                                  epoch, start_offset, replaced)
            del self._epochs[cut:], self._starts[cut:]
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self._latest = epoch
        self._changed()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries starting at or after ``end_offset`` (the log was cut there)."""
        cut = bisect.bisect_left(self._starts, end_offset)
        if end_offset >= 0 and cut < len(self._starts):
            del self._epochs[cut:], self._starts[cut:]
            self._latest = self._epochs[-1] if self._epochs else UNDEFINED_EPOCH
            self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: the entry covering it starts there, and
        earlier entries (which ended at or before it) are dropped."""
        keep_from = bisect.bisect_right(self._starts, start_offset) - 1
        if keep_from < 0 or (keep_from == 0 and self._starts[0] == start_offset):
            return
        del self._epochs[:keep_from], self._starts[:keep_from]
        self._starts[0] = start_offset
        self._changed()

    def clear(self) -> None:
        """Forget every entry (the log was emptied)."""
        if self._epochs or self.dirty:
            self._epochs.clear()
            self._starts.clear()
            self._latest = UNDEFINED_EPOCH
            self._changed()

    def flush(self) -> None:
        """Write the file if an earlier write failed (StorageError if it fails again)."""
        if self.dirty:
            self._write()

    # ------------------------------------------------------------------ file
    def _changed(self) -> None:
        self.dirty = True
        self._write()

    def _write(self) -> None:
        lines = [str(EPOCH_CHECKPOINT_VERSION), str(len(self._epochs))]
        lines += [f"{e} {s}" for e, s in zip(self._epochs, self._starts)]
        try:
            self._files.write_file_atomically(self.path, ("\n".join(lines) + "\n").encode())
        except OSError as e:
            raise StorageError(f"writing {self.path} failed: {e.strerror or e} (errno {e.errno})") from None
        self.dirty = False

    def _load(self) -> None:
        try:
            fd = self._files.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("%s: unreadable (%s): starting with an empty leader-epoch cache", self.path, e)
            return
        try:
            raw = self._files.pread(fd, self._files.fstat_size(fd), 0)
        except OSError as e:
            log.warning("%s: unreadable (%s): starting with an empty leader-epoch cache", self.path, e)
            return
        finally:
            self._files.close(fd)
        try:
            entries = parse_checkpoint(raw)
        except ValueError as e:
            log.warning("%s: %s: starting with an empty leader-epoch cache", self.path, e)
            return
        self._epochs = [e for e, _ in entries]
        self._starts = [s for _, s in entries]
        self._latest = self._epochs[-1] if entries else UNDEFINED_EPOCH

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.path!r}, {self.entries})"


def parse_checkpoint(raw: bytes) -> list[EpochEntry]:
    """The entries of a ``leader-epoch-checkpoint`` file; ValueError if it is not sound."""
    try:
        lines = raw.decode("ascii").split("\n")
    except UnicodeDecodeError:
        raise ValueError("not ASCII text") from None
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise ValueError("no version and count lines")
    if lines[0] != str(EPOCH_CHECKPOINT_VERSION):
        raise ValueError(f"unknown version {lines[0][:20]!r}")
    count = _int(lines[1], "count")
    if count != len(lines) - 2:
        raise ValueError(f"count {count} but {len(lines) - 2} entry lines")
    entries = []
    for line in lines[2:]:
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"bad entry line {line[:40]!r}")
        entry = EpochEntry(_int(parts[0], "epoch"), _int(parts[1], "start offset"))
        if entry.epoch < 0 or entry.start_offset < 0:
            raise ValueError(f"negative entry {entry}")
        if entries and (entry.epoch <= entries[-1].epoch or entry.start_offset < entries[-1].start_offset):
            raise ValueError(f"entry {tuple(entry)} does not follow {tuple(entries[-1])}")
        entries.append(entry)
    return entries


def _int(text: str, what: str) -> int:
    if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
        raise ValueError(f"bad {what} {text[:20]!r}")
    return int(text)


def epoch_mismatch(requested, current: int):
    """Kafka's check of the leader epoch a request expects against the partition's: an
    older one is FENCED_LEADER_EPOCH (the asker's metadata is stale), a newer one
    UNKNOWN_LEADER_EPOCH (this broker has not heard of it yet); -1 (or no integer) is not
    checked. None when they agree."""
    if not isinstance(requested, int) or isinstance(requested, bool) or requested < 0 or requested == current:
        return None
    return ErrorCode.FENCED_LEADER_EPOCH if requested < current else ErrorCode.UNKNOWN_LEADER_EPOCH

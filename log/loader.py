"""Opening a partition directory: leftovers, swaps, index checks, and crash recovery.

Called once by ``Log.__init__`` in the partition's log actor (single-threaded, before any
append). ``load_log`` returns a ``LoadedLog`` (the segments, the last one active, and the
offsets found) that ``Log`` adopts in one place (``Log._adopt``); it never imports ``log.log``.
1. Read the clean-shutdown marker and the checkpoint; a missing or unreadable one means
   "recover everything".
2. Complete a compaction whose ``<base>.log.swap`` exists; remove ``.cleaned``, ``.tmp``,
   ``.deleted``, stray index ``.swap`` files and indexes without a ``.log``.
3. Trust segments below the recovery point, after a sanity check of their indexes (rebuilt if
   it fails).
4. From the recovery point (unclean start) or the active segment's last index entry (clean
   start), validate every batch (``recovery.scan_segment``); the first bad one ends the log.
Invariants: nothing raises on bad data (the ``RecoveryReport`` says what was dropped). The
checkpoint file's format (``partition.checkpoint``, ``Checkpoint.encode``) is here too.
"""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Callable, NamedTuple

from odradek.log import index as ix
from odradek.core.config import LogConfig
from odradek.log.files import FileLayer
from odradek.log.index import MIN_TS, IndexPolicy
from odradek.log.recovery import RecoveryReport, log, scan_segment
from odradek.log.segment import (CLEAN_SHUTDOWN, CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX,
                                 SEGMENT_RE, SWAP_SUFFIX, TIMEINDEX_SUFFIX, TMP_SUFFIX, segment_paths)
from odradek.log.segment_writer import LogSegment, create_segment, read_file

CHECKPOINT = "partition.checkpoint"
CHECKPOINT_VERSION = 0


class Checkpoint(NamedTuple):
    log_start_offset: int
    recovery_point: int
    high_watermark: int

    def encode(self) -> bytes:
        return (f"{CHECKPOINT_VERSION}\nlog_start_offset {self.log_start_offset}\n"
                f"recovery_point {self.recovery_point}\nhigh_watermark {self.high_watermark}\n").encode()


def read_checkpoint(files: FileLayer, directory: str) -> Checkpoint | None:
    """The partition's checkpoint, or None if it is missing or unreadable."""
    try:
        lines = read_file(files, os.path.join(directory, CHECKPOINT)).decode().split("\n")
        if lines[0] != str(CHECKPOINT_VERSION):
            return None
        values = dict(line.split(" ") for line in lines[1:4])
        return Checkpoint(int(values["log_start_offset"]), int(values["recovery_point"]),
                          int(values["high_watermark"]))
    except (ValueError, KeyError, IndexError, UnicodeDecodeError):
        return None


@dataclass
class LoadedLog:
    """What opening a partition directory found: the state ``Log`` adopts."""

    segments: list  # LogSegment, oldest first; the last one is active (its writers open)
    log_start_offset: int
    log_end_offset: int
    recovery_point: int
    high_watermark: int
    report: RecoveryReport
    # the data up to the durable log start was lost and the log restarted empty at this
    # offset: the epoch cache, producer state and transaction index start empty there too
    restarted_at: int | None = None


def load_log(directory: str, config: LogConfig, files: FileLayer, now_ms: Callable[[], int]) -> LoadedLog:
    """Open (or create) the partition directory and recover it (the steps above). OSError
    on an I/O failure, with every segment it opened closed again."""
    loader = _Loader(directory, config, files, now_ms)
    try:
        return loader.load()
    except BaseException:
        for seg in loader.segments:
            try:
                seg.close(trim=False)
            except OSError:
                pass
        raise


class _Loader:
    """The state of one load while it runs: the segments found so far and the log end."""

    def __init__(self, directory: str, config: LogConfig, files: FileLayer, now_ms: Callable[[], int]):
        self.dir = directory
        self.config = config
        self.files = files
        self.now = now_ms
        self.segments: list[LogSegment] = []
        self.bases: list[int] = []
        self.end = 0
        self.restarted_at: int | None = None

    def load(self) -> LoadedLog:
        files = self.files
        files.makedirs(self.dir)
        marker = os.path.join(self.dir, CLEAN_SHUTDOWN)
        clean = files.exists(marker) or not any(n.endswith(LOG_SUFFIX) for n in files.listdir(self.dir))
        report = RecoveryReport(clean)
        cp = read_checkpoint(files, self.dir)
        self._finish_interrupted_work(report)
        self._open_segments(cp)
        report.segments_loaded = len(self.segments)
        if clean:
            first_scan = len(self.segments) - 1
        else:
            rp = cp.recovery_point if cp else 0
            first_scan = max(bisect.bisect_right(self.bases, rp) - 1, 0)
        for seg, after in zip(self.segments[:first_scan], self.segments[1:first_scan + 1]):
            self._check_closed_indexes(seg, after.base_offset, report)
        self._recover_tail(first_scan, clean, report)
        if cp is not None and cp.log_start_offset > self.end:
            # the data up to the durable log start was lost: start empty at the log start
            report.reasons.append(f"log end {self.end} below the log start "
                                  f"{cp.log_start_offset}: restarting empty there")
            self._restart_empty(cp.log_start_offset)
        loaded = self._offsets(cp, clean, report)
        if files.exists(marker):
            files.unlink(marker)
        files.fsync_dir(self.dir)
        if report.lost_data or report.reasons:
            log.warning("%s: recovery dropped data: %s", self.dir, report.summary())
        return loaded

    def _finish_interrupted_work(self, report: RecoveryReport) -> None:
        files, directory = self.files, self.dir
        names = set(files.listdir(directory))
        for name in sorted(names):
            if name.endswith(LOG_SUFFIX + SWAP_SUFFIX):  # a compaction past its commit point
                base = name[:20]
                final = os.path.join(directory, name[:-len(SWAP_SUFFIX)])
                files.rename(os.path.join(directory, name), final)
                for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                    for extra in ("", SWAP_SUFFIX, CLEANED_SUFFIX):
                        self._remove(base + suffix + extra, report)
                report.swaps_completed.append(int(base))
        names = set(files.listdir(directory))
        logs = {n[:20] for n in names if n.endswith(LOG_SUFFIX) and SEGMENT_RE.fullmatch(n)}
        for name in sorted(names):
            m = SEGMENT_RE.fullmatch(name)
            if name.endswith((DELETED_SUFFIX, CLEANED_SUFFIX, TMP_SUFFIX)):
                self._remove(name, report)
            elif name.endswith(SWAP_SUFFIX):  # an index swap without its log: roll back
                self._remove(name, report)
                self._remove(name[:-len(SWAP_SUFFIX)], report)
            elif m and m.group(2) != "log" and m.group(1) not in logs:
                self._remove(name, report)

    def _remove(self, name: str, report: RecoveryReport) -> None:
        try:
            self.files.unlink(os.path.join(self.dir, name))
            report.files_removed.append(name)
        except FileNotFoundError:
            pass

    def _new_segment(self, base_offset: int, now: int) -> LogSegment:
        cfg = self.config
        return create_segment(self.files, self.dir, base_offset, now, cfg.max_index_entries,
                              cfg.index_interval_bytes)

    def _open_segments(self, cp: Checkpoint | None) -> None:
        files = self.files
        names = files.listdir(self.dir)
        bases = sorted(int(n[:20]) for n in names
                       if (m := SEGMENT_RE.fullmatch(n)) and m.group(2) == "log" and not m.group(3))
        now = self.now()
        for base in bases:  # no descriptor each: closed segments read through the descriptor cache
            seg = LogSegment(files, self.dir, base, None, files.file_size(segment_paths(self.dir, base)[0]), now)
            self.segments.append(seg)
            self.bases.append(base)
        if not self.segments:
            start = cp.log_start_offset if cp else 0
            self.segments.append(self._new_segment(start, now))
            self.bases.append(start)

    def _check_closed_indexes(self, seg: LogSegment, next_base: int, report: RecoveryReport) -> None:
        cfg = self.config
        if _indexes_look_sane(seg, cfg) and _timeindex_looks_sane(seg, next_base):
            seg.max_timestamp = seg.max_timestamp_from_index()
            return
        policy = IndexPolicy(cfg.index_interval_bytes)
        with seg.log_fd() as fd:
            scan = scan_segment(self.files, fd, seg.size, seg.base_offset, 0, seg.base_offset, policy)
        if scan.error:
            report.reasons.append(f"segment {seg.base_offset} (below the recovery point): {scan.error}; "
                                  "indexed its valid prefix only")
        final = policy.final_time_entry(scan.next_offset - seg.base_offset)
        seg.write_indexes(scan.offset_entries, scan.time_entries + ([final] if final else []),
                          cfg.max_index_entries)
        seg.max_timestamp = max(policy.max_ts, -1)
        report.indexes_rebuilt.append(seg.base_offset)

    def _recover_tail(self, first: int, clean: bool, report: RecoveryReport) -> None:
        """Validate segments from ``first`` to the end; cut at the first bad batch."""
        min_offset = self.bases[first]
        i = first
        while i < len(self.segments):
            seg = self.segments[i]
            active = i == len(self.segments) - 1
            scan = self._scan(seg, active, clean, max(min_offset, seg.base_offset), report)
            report.segments_scanned += 1
            report.batches_scanned += scan.batches
            if scan.error is not None:
                self._cut(i, seg, scan, report)
                active = True
            if not active:
                final = scan.policy.final_time_entry(scan.next_offset - seg.base_offset)
                seg.write_indexes(scan.offset_entries, scan.time_entries + ([final] if final else []),
                                  self.config.max_index_entries)
                seg.max_timestamp = max(scan.policy.max_ts, -1)
            min_offset = max(scan.next_offset, seg.base_offset)
            i += 1
        self.end = max(min_offset, self.bases[-1])

    def _scan(self, seg: LogSegment, active: bool, clean: bool, min_offset: int, report):
        """Scan one segment: resume from the last index entry if the indexes are trusted."""
        cfg, files = self.config, self.files
        resume = clean and _indexes_look_sane(seg, cfg)
        if active:
            size = seg.size
            if not resume:
                for p in (seg.index_path, seg.timeindex_path):
                    if files.exists(p):
                        files.unlink(p)
                seg.size = 0  # activate an empty index without walking the file
            seg.activate(cfg.max_index_entries, cfg.index_interval_bytes)
            seg.size = size
        start, policy = 0, IndexPolicy(cfg.index_interval_bytes)
        if resume:
            src, count = seg.offset_source()
            last = seg._verified(ix.offset_floor(src, count, 1 << 33)) if count else None
            tlast = ix.last_time_entry(*seg.time_source())
            t = tlast[0] if tlast else MIN_TS
            if last is not None:
                start, min_offset = last.position, last.header.base_offset
            policy = IndexPolicy(cfg.index_interval_bytes, 0, t, t)
        else:
            report.indexes_rebuilt.append(seg.base_offset)
        with seg.log_fd() as fd:
            scan = scan_segment(files, fd, seg.size, seg.base_offset, start, min_offset, policy,
                                resume_at=start if resume and start else None)
        report.bytes_scanned += scan.valid_end - start
        if active:
            for e in scan.offset_entries:
                seg.oidx.append(*e)
            for e in scan.time_entries:
                seg.tidx.append(*e)
            seg.policy = scan.policy
            seg.max_timestamp = max(scan.policy.max_ts, -1)
        return scan

    def _cut(self, i: int, seg: LogSegment, scan, report: RecoveryReport) -> None:
        """Keep the valid prefix of segment ``i``; delete every later segment."""
        files = self.files
        dropped = seg.size - scan.valid_end
        report.reasons.append(f"segment {seg.base_offset}: {scan.error}")
        report.truncated_segment = seg.base_offset
        report.truncated_at_position = scan.valid_end
        report.dropped_from_offset = scan.next_offset
        with seg.log_fd() as fd:
            files.ftruncate(fd, scan.valid_end)
            files.fsync(fd)
        seg.size = scan.valid_end
        while len(self.segments) > i + 1:
            later = self.segments.pop()
            self.bases.pop()
            dropped += later.size
            report.segments_deleted.append(later.base_offset)
            later.delete()
        report.dropped_bytes += dropped
        if seg.oidx is None:  # a closed segment becomes the active one
            cfg = self.config
            seg.write_indexes(scan.offset_entries, scan.time_entries, cfg.max_index_entries)
            seg.activate(cfg.max_index_entries, cfg.index_interval_bytes)
            seg.policy = scan.policy
            seg.max_timestamp = max(scan.policy.max_ts, -1)

    def _restart_empty(self, offset: int) -> None:
        """Drop every segment and start with one empty segment at ``offset``."""
        now = self.now()
        for seg in self.segments:
            seg.delete()
        self.segments, self.bases = [], []  # nothing to close if creating the new one fails
        self.segments, self.bases = [self._new_segment(offset, now)], [offset]
        self.end = offset
        self.restarted_at = offset

    def _offsets(self, cp: Checkpoint | None, clean: bool, report: RecoveryReport) -> LoadedLog:
        end = self.end
        start = min(max(cp.log_start_offset if cp else 0, self.bases[0]), end)
        if clean and cp is not None:
            recovery_point = min(max(cp.recovery_point, end), end)
        else:
            recovery_point = min(cp.recovery_point if cp else 0, end)
        recovery_point = max(recovery_point, start)
        hw = cp.high_watermark if cp else 0
        return LoadedLog(self.segments, start, end, recovery_point, min(max(hw, start), end), report,
                         self.restarted_at)


def _indexes_look_sane(seg: LogSegment, cfg) -> bool:
    """Cheap checks: files exist with whole entries; the last offset entry names its batch."""
    files = seg.files
    for path, size in ((seg.index_path, ix.OFFSET_ENTRY.size), (seg.timeindex_path, ix.TIME_ENTRY.size)):
        if not files.exists(path) or files.file_size(path) % size:
            return False
    if seg.size == 0:
        return True
    src, count = seg.offset_source()
    if count == 0:
        return seg.size <= cfg.index_interval_bytes + cfg.max_message_bytes
    seg.index_suspect = False
    last = ix.offset_floor(src, count, 1 << 33)
    return seg._verified(last) is not None


def _timeindex_looks_sane(seg: LogSegment, next_base: int) -> bool:
    """A closed segment's time index: present if it has data, increasing (probed at the first,
    middle and last entry), and naming no offset past the next segment's base."""
    src, count = seg.time_source()
    if count == 0:
        return seg.size == 0
    probes = [ix._time_entry(src, i) for i in sorted({0, count // 2, count - 1})]
    increasing = all(a[0] < b[0] and a[1] < b[1] for a, b in zip(probes, probes[1:]))
    return increasing and probes[-1][1] <= next_base - seg.base_offset

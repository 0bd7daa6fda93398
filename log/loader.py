"""Opening a partition directory: leftovers, swaps, index checks, and crash recovery.

Called once by ``Log.__init__`` (single-threaded, before any append). Steps:

1. Read the clean-shutdown marker and the checkpoint (log start, recovery point, high
   watermark); a missing or unreadable checkpoint means "recover everything".
2. Finish or roll back interrupted work: a ``<base>.log.swap`` (a compaction that reached its
   commit point) replaces ``<base>.log`` and that segment's indexes are rebuilt; ``.cleaned``,
   ``.tmp``, ``.deleted`` files, stray index ``.swap`` files and indexes without a ``.log``
   are removed.
3. Segments below the recovery point are trusted; their indexes get a cheap sanity check
   (sizes, last entry must point at the batch it names) and are rebuilt if it fails.
4. From the segment holding the recovery point (unclean start) or the active segment's last
   index entry (clean start), every batch is validated (``recovery.scan_segment``). The
   first bad one ends the log: the file is truncated there and later segments are deleted.
   Nothing raises on bad data; the ``RecoveryReport`` says what was dropped.
"""
from __future__ import annotations

import bisect
import os

from odradek.log import index as ix
from odradek.log.log import (CLEAN_SHUTDOWN, CLEANED_SUFFIX, DELETED_SUFFIX, SWAP_SUFFIX, TMP_SUFFIX,
                     Log, LogSegment)
from odradek.log.index import MIN_TS, IndexPolicy
from odradek.log.recovery import RecoveryReport, log, scan_segment
from odradek.log.segment import INDEX_SUFFIX, LOG_SUFFIX, SEGMENT_RE, TIMEINDEX_SUFFIX, segment_paths


def load_log(lg: Log) -> RecoveryReport:
    files = lg._files
    files.makedirs(lg.dir)
    marker = os.path.join(lg.dir, CLEAN_SHUTDOWN)
    clean = files.exists(marker) or not any(n.endswith(LOG_SUFFIX) for n in files.listdir(lg.dir))
    report = RecoveryReport(clean)
    cp = lg._read_checkpoint()
    _finish_interrupted_work(lg, report)
    _open_segments(lg, cp)
    report.segments_loaded = len(lg._segments)
    if clean:
        first_scan = len(lg._segments) - 1
    else:
        rp = cp.recovery_point if cp else 0
        first_scan = max(bisect.bisect_right(lg._bases, rp) - 1, 0)
    for seg, after in zip(lg._segments[:first_scan], lg._segments[1:first_scan + 1]):
        _check_closed_indexes(lg, seg, after.base_offset, report)
    _recover_tail(lg, first_scan, clean, report)
    if cp is not None and cp.log_start_offset > lg._log_end_offset:
        # the data up to the durable log start was lost: start empty at the log start
        report.reasons.append(f"log end {lg._log_end_offset} below the log start "
                              f"{cp.log_start_offset}: restarting empty there")
        lg._truncate_fully(cp.log_start_offset)
    _set_offsets(lg, cp, clean)
    if files.exists(marker):
        files.unlink(marker)
    files.fsync_dir(lg.dir)
    if report.lost_data or report.reasons:
        log.warning("%s: recovery dropped data: %s", lg.dir, report.summary())
    return report


def _finish_interrupted_work(lg: Log, report: RecoveryReport) -> None:
    files = lg._files
    names = set(files.listdir(lg.dir))
    for name in sorted(names):
        if name.endswith(LOG_SUFFIX + SWAP_SUFFIX):  # a compaction past its commit point
            base = name[:20]
            final = os.path.join(lg.dir, name[:-len(SWAP_SUFFIX)])
            files.rename(os.path.join(lg.dir, name), final)
            for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                for extra in ("", SWAP_SUFFIX, CLEANED_SUFFIX):
                    _remove(files, lg.dir, base + suffix + extra, report, names)
            report.swaps_completed.append(int(base))
    names = set(files.listdir(lg.dir))
    logs = {n[:20] for n in names if n.endswith(LOG_SUFFIX) and SEGMENT_RE.fullmatch(n)}
    for name in sorted(names):
        m = SEGMENT_RE.fullmatch(name)
        if name.endswith((DELETED_SUFFIX, CLEANED_SUFFIX, TMP_SUFFIX)):
            _remove(files, lg.dir, name, report, names)
        elif name.endswith(SWAP_SUFFIX):  # an index swap without its log: roll back
            _remove(files, lg.dir, name, report, names)
            _remove(files, lg.dir, name[:-len(SWAP_SUFFIX)], report, names)
        elif m and m.group(2) != "log" and m.group(1) not in logs:
            _remove(files, lg.dir, name, report, names)


def _remove(files, directory: str, name: str, report: RecoveryReport, names: set) -> None:
    path = os.path.join(directory, name)
    try:
        files.unlink(path)
        report.files_removed.append(name)
    except FileNotFoundError:
        pass


def _open_segments(lg: Log, cp) -> None:
    files = lg._files
    names = files.listdir(lg.dir)
    bases = sorted(int(n[:20]) for n in names
                   if (m := SEGMENT_RE.fullmatch(n)) and m.group(2) == "log" and not m.group(3))
    now = lg._now()
    for base in bases:  # no descriptor each: closed segments read through the descriptor cache
        seg = LogSegment(files, lg.dir, base, None, files.file_size(segment_paths(lg.dir, base)[0]), now)
        lg._segments.append(seg)
        lg._bases.append(base)
    if not lg._segments:
        start = cp.log_start_offset if cp else 0
        lg._segments.append(lg._create_segment(start, now))
        lg._bases.append(start)


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


def _check_closed_indexes(lg: Log, seg: LogSegment, next_base: int, report: RecoveryReport) -> None:
    if _indexes_look_sane(seg, lg.config) and _timeindex_looks_sane(seg, next_base):
        seg.max_timestamp = seg.max_timestamp_from_index()
        return
    policy = IndexPolicy(lg.config.index_interval_bytes)
    with seg.log_fd() as fd:
        scan = scan_segment(lg._files, fd, seg.size, seg.base_offset, 0, seg.base_offset, policy)
    if scan.error:
        report.reasons.append(f"segment {seg.base_offset} (below the recovery point): {scan.error}; "
                              "indexed its valid prefix only")
    final = policy.final_time_entry(scan.next_offset - seg.base_offset)
    seg.write_indexes(scan.offset_entries, scan.time_entries + ([final] if final else []),
                      lg.config.max_index_entries)
    seg.max_timestamp = max(policy.max_ts, -1)
    report.indexes_rebuilt.append(seg.base_offset)


def _recover_tail(lg: Log, first: int, clean: bool, report: RecoveryReport) -> None:
    """Validate segments from ``first`` to the end; cut at the first bad batch."""
    min_offset = lg._bases[first]
    i = first
    while i < len(lg._segments):
        seg = lg._segments[i]
        active = i == len(lg._segments) - 1
        scan = _scan(lg, seg, active, clean, max(min_offset, seg.base_offset), report)
        report.segments_scanned += 1
        report.batches_scanned += scan.batches
        if scan.error is not None:
            _cut(lg, i, seg, scan, report)
            active = True
        if not active:
            final = scan.policy.final_time_entry(scan.next_offset - seg.base_offset)
            seg.write_indexes(scan.offset_entries, scan.time_entries + ([final] if final else []),
                              lg.config.max_index_entries)
            seg.max_timestamp = max(scan.policy.max_ts, -1)
        min_offset = max(scan.next_offset, seg.base_offset)
        i += 1
    lg._log_end_offset = max(min_offset, lg._bases[-1])


def _scan(lg: Log, seg: LogSegment, active: bool, clean: bool, min_offset: int, report):
    """Scan one segment: resume from the last index entry if the indexes are trusted."""
    cfg = lg.config
    resume = clean and _indexes_look_sane(seg, cfg)
    if active:
        size = seg.size
        if not resume:
            for p in (seg.index_path, seg.timeindex_path):
                if lg._files.exists(p):
                    lg._files.unlink(p)
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
        scan = scan_segment(lg._files, fd, seg.size, seg.base_offset, start, min_offset, policy,
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


def _cut(lg: Log, i: int, seg: LogSegment, scan, report: RecoveryReport) -> None:
    """Keep the valid prefix of segment ``i``; delete every later segment."""
    files = lg._files
    dropped = seg.size - scan.valid_end
    report.reasons.append(f"segment {seg.base_offset}: {scan.error}")
    report.truncated_segment = seg.base_offset
    report.truncated_at_position = scan.valid_end
    report.dropped_from_offset = scan.next_offset
    with seg.log_fd() as fd:
        files.ftruncate(fd, scan.valid_end)
        files.fsync(fd)
    seg.size = scan.valid_end
    while len(lg._segments) > i + 1:
        later = lg._segments.pop()
        lg._bases.pop()
        dropped += later.size
        report.segments_deleted.append(later.base_offset)
        lg._delete_now(later)
    report.dropped_bytes += dropped
    if seg.oidx is None:  # a closed segment becomes the active one
        cfg = lg.config
        seg.write_indexes(scan.offset_entries, scan.time_entries, cfg.max_index_entries)
        seg.activate(cfg.max_index_entries, cfg.index_interval_bytes)
        seg.policy = scan.policy
        seg.max_timestamp = max(scan.policy.max_ts, -1)


def _set_offsets(lg: Log, cp, clean: bool) -> None:
    end = lg._log_end_offset
    start = max(cp.log_start_offset if cp else 0, lg._bases[0])
    lg._log_start_offset = min(start, end)
    if clean and cp is not None:
        lg._recovery_point = min(max(cp.recovery_point, end), end)
    else:
        lg._recovery_point = min(cp.recovery_point if cp else 0, end)
    lg._recovery_point = max(lg._recovery_point, lg._log_start_offset)
    hw = cp.high_watermark if cp else 0
    lg._high_watermark = min(max(hw, lg._log_start_offset), end)

"""Log compaction (``cleanup.policy=compact`` or ``compact,delete``): keep the latest record per key.

Runs in the partition's log actor, between appends, on the same ``Log`` (single writer); the
one broker-side place that decodes records. One pass, ``clean(log)``:
1. Cleanable: closed segments, oldest first, up to the first younger than
   ``min.compaction.lag.ms`` or reaching the last stable offset; skipped unless the dirty bytes
   (past the cleaner checkpoint) are at least ``min.cleanable.dirty.ratio`` of them.
2. Map each key to its latest offset; records of aborted transactions (``aborted.txnindex``)
   never count and are removed.
3. Rewrite each segment that loses records: whole surviving batches copied byte for byte,
   others re-encoded with the survivors in the batch's own format and codec, keeping offsets,
   producer fields and attribute bits (a magic-2 batch its base offset and last offset delta);
   empty batches vanish; tombstones survive until their segment is older than
   ``delete.retention.ms``.
4. Swap: ``.cleaned`` files, fsync, rename to ``.swap`` (the log's rename is the commit
   point), rename over the final names, fsync the directory.
Invariants: the active segment is never touched; nothing above the high watermark or in an open
transaction is compacted; batches are read one at a time, never a whole segment; a crash at any
step leaves the log as before or after the pass (``log.loader`` completes or rolls back).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from odradek.log import index as ix
from odradek.core.errors import StorageError
from odradek.core.protocol import OdradekError
from odradek.log.index import IndexPolicy
from odradek.log.log import Log
from odradek.log.segment import CLEANED_SUFFIX, SWAP_SUFFIX
from odradek.log.segment_writer import LogSegment, read_file
from odradek.core import kafka_batch
from odradek.core.records import (COMPRESSION_LZ4, HEADER_SIZE, TRANSACTIONAL_BIT, BatchHeader, check_header,
                                 decode_batch, encode_records)

CLEANER_CHECKPOINT = "cleaner.checkpoint"


@dataclass
class CleanResult:
    cleaned: bool = False
    reason: str = ""
    segments_rewritten: list = field(default_factory=list)
    records_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def first_dirty_offset(lg: Log) -> int:
    raw = read_file(lg.files, os.path.join(lg.dir, CLEANER_CHECKPOINT))
    try:
        return int(raw.decode().strip() or 0)
    except (ValueError, UnicodeDecodeError):
        return 0


def clean(lg: Log, force: bool = False) -> CleanResult:
    """One compaction pass over ``lg`` (no-op unless the policy includes compact)."""
    if not lg.config.compact:
        return CleanResult(reason="cleanup.policy has no compact")
    now = lg.now_ms()
    segments = _cleanable(lg, now)
    if not segments:
        return CleanResult(reason="no closed segment is older than min.compaction.lag.ms and below the "
                                  "last stable offset")
    dirty_from = first_dirty_offset(lg)
    total = sum(s.size for s in segments)
    dirty = sum(s.size for s in segments if s.base_offset >= dirty_from)
    if not force and (total == 0 or dirty / total < lg.config.min_cleanable_dirty_ratio):
        return CleanResult(reason=f"dirty ratio {dirty}/{total} below min.cleanable.dirty.ratio")
    try:
        aborted = _aborted_spans(lg)
        latest = _latest_offsets(segments, aborted)
        result = CleanResult(cleaned=True)
        for seg in segments:
            _clean_segment(lg, seg, latest, aborted, now, result)
        end = lg.segments[len(segments)].base_offset
        lg.files.write_file_atomically(os.path.join(lg.dir, CLEANER_CHECKPOINT), str(end).encode())
    except OSError as e:
        raise StorageError(f"compaction of {lg.dir} failed: {e}") from None
    return result


def _cleanable(lg: Log, now: int) -> list[LogSegment]:
    out, stable, segments = [], lg.last_stable_offset, lg.segments
    for seg, after in zip(segments, segments[1:]):
        if seg.max_timestamp > now - lg.config.min_compaction_lag_ms or after.base_offset > stable:
            break
        out.append(seg)
    return out


def _batches(seg: LogSegment):
    """Each whole batch of ``seg`` with its header, read one at a time (a segment may be
    ``segment.bytes`` large)."""
    pos = 0
    while seg.size - pos >= HEADER_SIZE:
        h = BatchHeader.read(seg.pread(HEADER_SIZE, pos))
        check_header(h, pos)
        if pos + h.size > seg.size:
            return
        yield h, seg.pread(h.size, pos)
        pos += h.size


def _aborted_spans(lg: Log) -> dict:
    """Producer id -> ``(first offset, abort marker offset)`` of its aborted transactions."""
    spans: dict = {}
    for e in lg.txn_index.entries:
        spans.setdefault(e.producer_id, []).append((e.first_offset, e.last_offset))
    return spans


def _is_aborted(h: BatchHeader, aborted: dict) -> bool:
    if not h.attributes & TRANSACTIONAL_BIT or h.is_control:
        return False
    return any(first <= h.base_offset <= last for first, last in aborted.get(h.producer_id, ()))


def _latest_offsets(segments: list[LogSegment], aborted: dict) -> dict:
    latest = {}
    for seg in segments:
        for h, raw in _batches(seg):
            if h.is_control or _is_aborted(h, aborted):
                continue
            for r in _records(h, raw):
                latest[r.key] = r.offset
    return latest


def _records(h: BatchHeader, raw) -> list:
    """The batch's records, compressed ones inflated within the bound (core/inflate.py: a
    batch written before produce validation may be a compression bomb). An error names the
    batch; the log actor logs it with the partition and the pass is abandoned."""
    try:
        return decode_batch(raw)
    except OdradekError as exc:
        raise type(exc)(f"batch at offset {h.base_offset}: {exc.message}; the partition is not compacted "
                        f"while it is there") from None


def _clean_segment(lg: Log, seg: LogSegment, latest: dict, aborted: dict, now: int,
                   result: CleanResult) -> None:
    drop_tombstones = seg.max_timestamp < now - lg.config.delete_retention_ms
    out, changed, removed = [], False, 0
    for h, raw in _batches(seg):
        if h.is_control:
            out.append((h, bytes(raw)))
            continue
        if _is_aborted(h, aborted):
            removed += h.record_count
            changed = True
            continue
        records = _records(h, raw)
        keep = [r for r in records
                if latest.get(r.key) == r.offset and not (r.value is None and drop_tombstones)]
        removed += len(records) - len(keep)
        if len(keep) == len(records):
            out.append((h, bytes(raw)))
        elif keep:
            out.append((h, _reencode(h, keep)))
            changed = True
        else:
            changed = True
    if not changed:
        return
    result.records_removed += removed
    result.bytes_before += seg.size
    new = _swap_in(lg, seg, out)
    result.bytes_after += new.size
    result.segments_rewritten.append(seg.base_offset)


def _reencode(h: BatchHeader, keep) -> bytes:
    """The survivors ``keep`` of batch ``h`` in ``h``'s own format, codec and flags."""
    if h.magic == kafka_batch.MAGIC:
        return kafka_batch.encode(
            keep, base_offset=h.base_offset, last_offset_delta=h.last_offset_delta,
            first_timestamp=min(r.timestamp for r in keep), max_timestamp=h.max_timestamp,
            partition_leader_epoch=h.partition_leader_epoch,
            attributes=h.attributes & (kafka_batch.TIMESTAMP_TYPE_BIT | kafka_batch.TRANSACTIONAL_BIT),
            producer_id=h.producer_id, producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
            compression=kafka_batch.CODECS[h.compression])
    # a native batch's last record is at its last offset delta (records.decode_batch), so the
    # base moves to the first survivor and the base sequence with it
    shift = keep[0].offset - h.base_offset
    return encode_records(keep, "lz4" if h.compression == COMPRESSION_LZ4 else None,
                          producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                          base_sequence=h.base_sequence + shift if h.base_sequence >= 0 else -1,
                          partition_leader_epoch=h.partition_leader_epoch,
                          log_append_time=h.log_append_time,
                          transactional=bool(h.attributes & TRANSACTIONAL_BIT))


def _swap_in(lg: Log, old: LogSegment, batches: list) -> LogSegment:
    files, cfg = lg.files, lg.config
    data = b"".join(b for _, b in batches)
    policy = IndexPolicy(cfg.index_interval_bytes)
    oentries, tentries, pos = [], [], 0
    for h, b in batches:
        h2 = BatchHeader.read(b)
        due = policy.before_batch(pos, h2.base_offset - old.base_offset)
        if due:
            oentries.append(due[0])
            if due[1]:
                tentries.append(due[1])
        policy.after_batch(len(b), h2.max_timestamp)
        pos += len(b)
    last_next = BatchHeader.read(batches[-1][1]).next_offset if batches else old.base_offset
    final = policy.final_time_entry(last_next - old.base_offset)
    if final:
        tentries.append(final)
    odata = b"".join(ix.OFFSET_ENTRY.pack(*e) for e in oentries)
    tdata = b"".join(ix.TIME_ENTRY.pack(*e) for e in tentries)
    # 1. write the three .cleaned files and make them durable
    targets = ((old.index_path, odata), (old.timeindex_path, tdata), (old.log_path, data))
    for path, content in targets:
        files.write_file_durably(path + CLEANED_SUFFIX, content)
    # 2. .cleaned -> .swap, the log last: its .swap is the commit point
    for path, _ in targets:
        files.rename(path + CLEANED_SUFFIX, path + SWAP_SUFFIX)
    files.fsync_dir(lg.dir)
    # 3. .swap -> final names, the log first
    for path in (old.log_path, old.index_path, old.timeindex_path):
        files.rename(path + SWAP_SUFFIX, path)
    files.fsync_dir(lg.dir)
    old.close(trim=False)  # drops the cached descriptors of the replaced files
    new = LogSegment(files, lg.dir, old.base_offset, None, len(data), old.created_ms)
    new._closed_sources[new.index_path] = (ix.BufferSource(odata), len(oentries))
    new._closed_sources[new.timeindex_path] = (ix.BufferSource(tdata), len(tentries))
    new.max_timestamp = max(policy.max_ts, -1)
    lg.replace_segment(old, new)
    return new

"""Storage benchmark: ``python -m odradek.bench.storage [--quick] [--runs N] [--dir PATH]``.

A tool, run by hand (and by a smoke test in ``--quick`` mode); it uses the log library in one
process, no actors. Each figure is measured ``--runs`` times (default 5) and the median is
printed with the range of the runs, as a markdown table for docs/BENCHMARKS.md;
``--only append`` (or lookup, recovery, memory) runs one group. Measures:

- append throughput of 1 MiB and 16 KiB batches through ``Log.append``, as a ratio to a plain
  sequential ``os.pwrite`` of the same bytes from the same buffer, same chunks, same
  directory (same file system), in the same run, interleaved (neither side fsyncs: the
  default flush policy). Two paths, each named in its row: "CRC in append"
  (``crc_checked=False``: append runs zlib.crc32 over every batch) and "CRC checked by the
  caller" (``crc_checked=True``: what the broker's log actor calls, the request handlers
  having checked the CRC; every other check stays). The input is a ``zmq.Frame`` holding
  the batch, as the log actor receives it (never written into: 16 patched bytes + the rest);
  and, for 16 KiB batches, the microseconds an append costs with the segment write stubbed
  out (best of 5 passes): the log's own work, steadier than the ratio on a shared machine;
- random-offset lookup latency (``Log.read`` and ``LogReader.read``) in a log of >= 1,000
  segments, p50 and p99;
- recovery time of a log whose segments were never flushed and whose checkpoint says
  "recover everything" (full scan: every header, every CRC, index rebuild);
- process RSS (psutil) while reading a log much larger than a fixed budget, batch by batch.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time

import psutil

from odradek.core.config import LogConfig
from odradek.log.files import FileLayer
from odradek.log.log import Log
from odradek.log.reader import LogReader
from odradek.core.records import encode_batch

MiB = 1 << 20


def _payload_batch(size: int) -> bytes:
    """A CRC-valid uncompressed batch of about ``size`` bytes (incompressible values)."""
    value = os.urandom(max(size - 200, 1))
    return encode_batch([(b"key", value)], None)


def bench_append(root: str, batch_size: int, total: int, crc_checked: bool = False,
                 rounds: int = 32) -> dict:
    """Interleave ``rounds`` slices of plain writes and log appends (alternating which goes
    first) so both see the same disk and page-cache conditions (the machine is shared). The
    run's ratio is the median over the rounds of plain time / log time of the two adjacent
    slices, so a burst of a neighbour's I/O that lands on one slice does not decide it;
    throughput and per-batch times are from the sums. Both sides write the same ``zmq.Frame`` (the log actor's input) at
    increasing positions of a fresh file in ``root``; the plain side is one ``os.pwrite`` per
    batch (looping only on a short write), the least a sequential writer can do."""
    import zmq  # the broker's transport; only here, so the log library does not need it
    batch = zmq.Frame(_payload_batch(batch_size))
    n = len(batch)
    per_round = max(total // n // rounds, 1)
    plain = os.path.join(root, "plain.bin")
    fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    d = os.path.join(root, "append-0")
    lg = Log(d, LogConfig(segment_bytes=1 << 30, max_message_bytes=2 * MiB))
    append, pwrite, perf = lg.append, os.pwrite, time.perf_counter
    plain_s = log_s = 0.0
    pos = 0

    def plain_slice():
        nonlocal pos
        t = perf()
        for _ in range(per_round):
            w = pwrite(fd, batch, pos)
            if w != n:  # a short write (never seen here): finish it
                view = memoryview(batch)[w:]
                while view:
                    k = pwrite(fd, view, pos + w)
                    w += k
                    view = view[k:]
            pos += n
        return perf() - t

    def log_slice():
        t = perf()
        for _ in range(per_round):
            append(batch, crc_checked=crc_checked)
        return perf() - t

    pairs = []
    for r in range(rounds):
        if r % 2:
            lt = log_slice()
            pt = plain_slice()
        else:
            pt = plain_slice()
            lt = log_slice()
        log_s += lt
        plain_s += pt
        pairs.append(pt / lt)
    assert lg.size == pos  # the same bytes on each side
    os.close(fd)
    os.unlink(plain)
    lg.abandon()
    shutil.rmtree(d)
    count = rounds * per_round
    mb = count * n / MiB
    return {"plain_MBps": mb / plain_s, "log_MBps": mb / log_s, "ratio": statistics.median(pairs),
            "ratio_of_sums": plain_s / log_s,
            "plain_us": plain_s / count * 1e6, "log_us": log_s / count * 1e6}


class _NoWrites(FileLayer):
    """Appends of ``size``-byte batches that only report success: what is left of an append
    is its own work (checks, offsets, index, CRC). Other file calls are real."""

    def __init__(self, size: int):
        self.size = size

    def pwritev(self, fd, buffers, position):
        return self.size

    def pwrite(self, fd, data, position):
        return len(data)


def bench_append_cpu(root: str, batch_size: int, crc_checked: bool, count: int = 20000) -> float:
    """Microseconds of ``Log.append`` per batch with the segment write stubbed out (the index,
    checks, offsets and CRC remain): the cost the log adds on top of the write itself. The
    best of 5 passes (a CPU-bound figure; the slower passes measure the neighbours)."""
    import zmq
    batch = zmq.Frame(_payload_batch(batch_size))
    d = os.path.join(root, "cpu-0")
    lg = Log(d, LogConfig(segment_bytes=1 << 30, max_message_bytes=2 * MiB), files=_NoWrites(len(batch)))
    append, best = lg.append, float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(count):
            append(batch, crc_checked=crc_checked)
        best = min(best, time.perf_counter() - t)
    lg.abandon()
    shutil.rmtree(d)
    return best / count * 1e6


def build_log(directory: str, segments: int, batch_size: int, per_segment: int) -> Log:
    cfg = LogConfig(segment_bytes=batch_size * per_segment + 64, segment_index_bytes=64 << 10,
                    index_interval_bytes=4096)
    lg = Log(directory, cfg)
    batch = _payload_batch(batch_size)
    while len(lg.segments) < segments:
        lg.append(batch)
    return lg


def bench_lookup(root: str, segments: int, lookups: int) -> dict:
    d = os.path.join(root, "lookup-0")
    lg = build_log(d, segments, 1024, 32)
    lg.high_watermark = lg.log_end_offset
    end = lg.log_end_offset
    rnd = random.Random(1)
    offsets = [rnd.randrange(end) for _ in range(lookups)]
    out = {"segments": len(lg.segments), "records": end}
    reader = LogReader(d, lg.bounds())
    for name, fn in (("Log.read", lg.read), ("LogReader.read", reader.read)):
        lat = []
        for off in offsets:
            t = time.perf_counter_ns()
            r = fn(off, 64 << 10)
            lat.append(time.perf_counter_ns() - t)
            assert r.first_offset is not None and r.first_offset <= off
        lat.sort()
        out[name] = (lat[len(lat) // 2] / 1000, lat[int(len(lat) * 0.99)] / 1000)
    reader.close()
    lg.abandon()
    shutil.rmtree(d)
    return out


def bench_recovery(root: str, total: int) -> dict:
    d = os.path.join(root, "recover-0")
    lg = Log(d, LogConfig(segment_bytes=128 * MiB, max_message_bytes=2 * MiB))
    batch = _payload_batch(MiB)
    while lg.size < total:
        lg.append(batch)
    size = lg.size
    lg.abandon()  # no flush, no checkpoint, no marker: recovery scans from offset 0
    t = time.perf_counter()
    again = Log(d, LogConfig(segment_bytes=128 * MiB, max_message_bytes=2 * MiB))
    seconds = time.perf_counter() - t
    report = again.recovery_report
    assert report.bytes_scanned == size and not report.lost_data, report.summary()
    again.abandon()
    shutil.rmtree(d)
    return {"bytes": size, "seconds": seconds, "GBps": size / seconds / (1 << 30),
            "segments": report.segments_scanned}


def bench_memory(root: str, total: int, budget: int) -> dict:
    d = os.path.join(root, "memory-0")
    proc = psutil.Process()
    lg = Log(d, LogConfig(segment_bytes=64 * MiB, max_message_bytes=2 * MiB))
    batch = _payload_batch(256 << 10)
    while lg.size < total:
        lg.append(batch)
    lg.high_watermark = lg.log_end_offset
    size = lg.size
    reader = LogReader(d, lg.bounds())
    base = proc.memory_info().rss
    peak = base
    offset, read = 0, 0
    while offset < lg.log_end_offset:
        r = reader.read(offset, MiB)
        data = r.read_bytes()
        read += len(data)
        offset = _next_offset(data)
        peak = max(peak, proc.memory_info().rss)
    reader.close()
    lg.abandon()
    shutil.rmtree(d)
    assert read == size
    return {"log_bytes": size, "rss_start": base, "rss_peak": peak, "growth": peak - base,
            "budget": budget, "within": peak - base < budget}


def _next_offset(data: bytes) -> int:
    from odradek.core.records import iter_batches
    last = None
    for _, h in iter_batches(data):
        last = h
    return last.next_offset


def median(values):
    return statistics.median(values)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m odradek.bench.storage", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test (seconds)")
    p.add_argument("--runs", type=int, default=None, help="repetitions per figure (default 5, quick 1)")
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir on /tmp's disk)")
    p.add_argument("--only", choices=("append", "lookup", "recovery", "memory"), action="append",
                   help="run only these figures (repeatable)")
    a = p.parse_args(argv)
    runs = a.runs or (1 if a.quick else 5)
    only = set(a.only or ("append", "lookup", "recovery", "memory"))
    sizes = dict(append=32 * MiB, segments=1000, lookups=2000, recovery=64 * MiB,
                 memory=128 * MiB, budget=64 * MiB) if a.quick else dict(
        append=256 * MiB, segments=1000, lookups=20000, recovery=1 << 30,
        memory=4 << 30, budget=64 * MiB)
    root = tempfile.mkdtemp(prefix="odradek-bench-", dir=a.dir)
    rows = []
    try:
        for bs, size_label in ((MiB, "1 MiB"), (16 << 10, "16 KiB")) if "append" in only else ():
            for checked, path in ((False, "CRC in append (crc_checked=False)"),
                                  (True, "CRC checked by the caller (crc_checked=True, the broker's path)")):
                res = [bench_append(root, bs, sizes["append"], checked) for _ in range(runs)]
                ratios = [r["ratio"] for r in res]
                rows.append((f"append, {size_label} batches, {path}: log / plain pwrite of the same bytes",
                             f"{median(ratios):.2f}x (runs {min(ratios):.2f}-{max(ratios):.2f}; ratio of "
                             f"summed times {median([r['ratio_of_sums'] for r in res]):.2f}x; "
                             f"{median([r['log_us'] for r in res]):.1f} vs "
                             f"{median([r['plain_us'] for r in res]):.1f} us per batch, "
                             f"{median([r['log_MBps'] for r in res]):.0f} vs "
                             f"{median([r['plain_MBps'] for r in res]):.0f} MB/s)", ">= 0.8x"))
        for bs, size_label in ((16 << 10, "16 KiB"),) if "append" in only else ():
            for checked, path in ((False, "CRC in append"), (True, "CRC checked by the caller")):
                cpu = [bench_append_cpu(root, bs, checked, 2000 if a.quick else 20000) for _ in range(runs)]
                rows.append((f"append, {size_label} batches, {path}: Python work per append, write stubbed out",
                             f"{median(cpu):.2f} us (runs {min(cpu):.2f}-{max(cpu):.2f})", "-"))
        res = [bench_lookup(root, sizes["segments"], sizes["lookups"]) for _ in range(runs)] if "lookup" in only else []
        for name in ("Log.read", "LogReader.read") if res else ():
            rows.append((f"random-offset {name}, {res[0]['segments']} segments: p50 / p99",
                         f"{median([r[name][0] for r in res]):.0f} / {median([r[name][1] for r in res]):.0f} us",
                         "p99 < 1000 us"))
        res = [bench_recovery(root, sizes["recovery"]) for _ in range(runs)] if "recovery" in only else []
        if res:
            rows.append((f"recovery of {res[0]['bytes'] / MiB:.0f} MiB unflushed ({res[0]['segments']} segments, "
                         "full CRC scan + index rebuild)",
                         f"{median([r['seconds'] for r in res]):.2f} s ({median([r['GBps'] for r in res]):.2f} GiB/s)",
                         "< 5 s for 1 GiB"))
        res = [bench_memory(root, sizes["memory"], sizes["budget"]) for _ in range(runs)] if "memory" in only else []
        if res:
            rows.append((f"RSS growth reading {res[0]['log_bytes'] / MiB:.0f} MiB end to end (LogReader)",
                         f"{median([r['growth'] for r in res]) / MiB:.1f} MiB "
                         f"(start {median([r['rss_start'] for r in res]) / MiB:.0f} MiB)",
                         f"< {sizes['budget'] / MiB:.0f} MiB"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"| figure (median of {runs}) | result | goal |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
